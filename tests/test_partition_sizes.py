"""Partitions and the sizes they read: every partition gets each size it needs on one of its tensor inputs (an
engine takes tensors only and recomputes sizes from their shapes), takes no tensor only for a size another input
carries, and is never a lone cast or view (the forms of issue 35, items 2 and 3).
"""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.engines import onnx_build
from et_trt_backend.op_support import aten_overload
from et_trt_partitioner import TensorRTPartitioner
from support.lowering import assert_onnx_matches_partition, delegated_parts
from support.nvidia_builders import tensorrt_rtx_or_skip

NEVER_BUILD = {"default": {"engine_build": "never"}}


def outside_tensorrt(t: torch.Tensor) -> torch.Tensor:
    """The diagonal of `t`'s last two dimensions: an op that stays in ExecuTorch (no TensorRT lowering)."""
    return t.diagonal(0, -2, -1)


def _lower(module, x, dims):
    exported = torch.export.export(module, (x,), dynamic_shapes=(dims,))
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(NEVER_BUILD)])
    outside = [str(aten_overload(n.target)) for n in edge.exported_program().graph.nodes if n.op == "call_function"
               and n.target is not torch.ops.higher_order.executorch_call_delegate
               and getattr(n.target, "__name__", "") != "getitem" and n.target is not torch.ops.aten.sym_size.int]
    return delegated_parts(edge), outside


def _onnx_ops(contents) -> list[str]:
    return [n.op_type for n in onnx.ModelProto.FromString(contents.onnx).graph.node]


class RotaryTable(torch.nn.Module):
    """Issue 35's first form: a rotary table computed from the token count alone, split from the rest by an op
    that stays in ExecuTorch, and a second reader of the same count."""

    def __init__(self, strided_write: bool):
        super().__init__()
        self.strided_write = strided_write
        self.register_buffer("inv_freq", torch.linspace(1.0, 0.01, 4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [1, tokens, 8]
        ang = torch.arange(x.shape[1]).float()[:, None] * self.inv_freq
        if self.strided_write:
            ang[:, 1:4:2] = ang[:, 1:4:2] * 2.0
        else:
            ang = outside_tensorrt(ang[:, :, None].expand(-1, -1, 4))
        pos = torch.arange(x.shape[1]).float()[None, :, None]
        return x * torch.cat([ang.cos(), ang.sin()], -1).to(x.dtype) + pos.to(x.dtype)


TOKENS = {1: torch.export.Dim("tokens", min=2, max=64)}


def test_a_size_no_tensor_carries_is_read_in_executorch():
    parts, outside = _lower(RotaryTable(strided_write=False), torch.randn(1, 6, 8), TOKENS)
    # The table's arange stays with the diagonal: its output carries the token count into the engine.
    assert "aten.arange.start_step" in outside and "aten.diagonal_copy.default" in outside, outside
    assert len(parts) == 2
    for program, contents in parts:
        for tokens in (2, 7, 64):
            assert_onnx_matches_partition(program, contents, tokens)


def test_the_strided_write_form_is_one_partition():
    parts, outside = _lower(RotaryTable(strided_write=True), torch.randn(1, 6, 8), TOKENS)
    assert outside == [] and len(parts) == 1
    for tokens in (2, 7, 64):
        assert_onnx_matches_partition(*parts[0], tokens)


class PaddedCumsum(torch.nn.Module):
    """Issue 35's second form: the size lost behind a pad (mamba2 / delta-net chunking)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (16 - x.shape[1] % 16) % 16
        y = F.pad(self.lin(x), (0, 0, 0, pad)).cumsum(1) * 2
        return y[:, : y.shape[1] - pad]


def test_the_padded_form_is_one_partition_the_real_builder_takes():
    parts, outside = _lower(PaddedCumsum(), torch.randn(1, 6, 8), {1: torch.export.Dim("tokens", min=2, max=64)})
    assert outside == [] and len(parts) == 1, outside
    ((program, contents),) = parts
    assert "Pad" in _onnx_ops(contents)
    for tokens in (2, 16, 17, 64):
        assert_onnx_matches_partition(program, contents, tokens)
    assert len(onnx_build.parse_and_build(tensorrt_rtx_or_skip(), contents, "sm_80").plan) > 0


class ImageFeaturesHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3 * 4, 8)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        feats = outside_tensorrt(image)
        return self.head(feats.reshape(image.shape[0], -1))


def test_an_engine_takes_no_tensor_only_for_its_size():
    parts, _ = _lower(ImageFeaturesHead(), torch.randn(2, 3, 4, 4), {0: torch.export.Dim("batch", min=1, max=8)})
    ((program, contents),) = parts
    assert len(contents.inputs) == 1  # the features, not the image too
    for batch in (1, 5):
        assert_onnx_matches_partition(program, contents, {"batch": batch})


class CastOutside(torch.nn.Module):
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return outside_tensorrt(image.to(torch.bfloat16))


class CastThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4).to(torch.bfloat16)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.lin(image.to(torch.bfloat16).reshape(-1, 4))


def test_a_lone_cast_is_no_engine():
    parts, outside = _lower(CastOutside(), torch.randn(2, 3, 4, 4), {0: torch.export.Dim("batch", min=1, max=8)})
    assert parts == []
    assert "dim_order_ops._to_dim_order_copy.default" in outside, outside


class CastThenConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3).to(torch.bfloat16)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image.to(torch.bfloat16))


def test_a_cast_joins_the_convolution_it_feeds():
    parts, outside = _lower(CastThenConv(), torch.randn(2, 3, 8, 8), {0: torch.export.Dim("batch", min=1, max=8)})
    assert outside == []
    ((program, contents),) = parts
    assert _onnx_ops(contents)[:2] == ["Cast", "Conv"]
    assert_onnx_matches_partition(program, contents, {"batch": 1}, rtol=2e-2, atol=2e-2)  # bf16 weights and image


def test_a_cast_joins_the_computation_it_feeds():
    parts, outside = _lower(CastThenLinear(), torch.randn(2, 3, 4, 4), {0: torch.export.Dim("batch", min=1, max=8)})
    assert outside == []
    ((_, contents),) = parts
    assert {"Cast", "Gemm"} <= set(_onnx_ops(contents)) or {"Cast", "MatMul"} <= set(_onnx_ops(contents))

