"""Interpolation: F.interpolate's nearest and bilinear modes on 4-D inputs (TensorRT Resize layer).

They reach an edge program as upsample_nearest2d.vec / upsample_bilinear2d.vec (both core ATen), lowered
to ONNX Resize with PyTorch's coordinate rule (nearest: asymmetric, floor; bilinear: pytorch_half_pixel, or
align_corners). Other modes and ranks are not core ATen: ExecuTorch decomposes them into index arithmetic.
"""

from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, Rule, rule_dtypes

aten = torch.ops.aten

_upsample = rule_dtypes(FLOAT_DTYPES)

RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.upsample_nearest2d.vec: _upsample,
    aten.upsample_bilinear2d.vec: _upsample,
}
