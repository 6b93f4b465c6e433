"""Padding (TensorRT Slice layers in fill mode, from ONNX Pad).

F.pad(mode="constant") becomes constant_pad_nd (negative pads crop), its sizes static or computed from the
dynamic dimensions (ONNX Pad takes them as a tensor: mamba2 and gated delta-net pad the token count to a
multiple of their chunk); reflect and replicate padding arrive decomposed by ExecuTorch into index ops (arange,
abs / clamp, index) that the indexing rules take.
"""

from __future__ import annotations

import torch

from ._common import NUMERIC_DTYPES, Rule, rule_dtypes

aten = torch.ops.aten


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.constant_pad_nd.default: rule_dtypes(NUMERIC_DTYPES),
}
