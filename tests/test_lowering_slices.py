"""Strided writes into slices (aten.slice_scatter with any step: Qwen3-VL's interleaved rotary sections write
freqs[..., 1:length:3]) lower whole: the partition's ONNX matches PyTorch for several token counts, and NVIDIA's
own parser and builder (TensorRT for RTX) take it.
"""

from __future__ import annotations

import onnx
import pytest
import torch

from et_trt_backend.engines import onnx_build
from et_trt_partitioner import TensorRTPartitioner
from support.lowering import assert_onnx_matches_partition, lower_program
from support.nvidia_builders import tensorrt_rtx_or_skip


class StridedWrites(torch.nn.Module):
    def forward(self, x):
        y = x * 1.5
        y[:, 1:8:3] = y[:, 1:8:3] * 2.0  # step 3 (Qwen3-VL's mrope sections)
        y[:, -5::2] = x[:, -5::2] + 1.0  # a negative start
        y[1::2] = y[1::2] * -1.0  # along the dynamic token count
        y[::4, 2:11:4] = 0.5 * y[::4, 2:11:4]  # two strided dims at once
        return y


@pytest.fixture(scope="module")
def partition():
    # torch.export guards strided slices of a dynamic dimension to at least 5 tokens here (its own rule)
    exported = torch.export.export(StridedWrites(), (torch.randn(9, 12),),
                                   dynamic_shapes=({0: torch.export.Dim("tokens", min=5, max=64)},))
    (program, contents), = lower_program(exported, TensorRTPartitioner({"default": {"engine_build": "never"}}))
    return program, contents


def test_every_strided_write_is_in_the_partition(partition):
    program, contents = partition
    steps = [n.args[5] for n in program.graph.nodes if "slice_scatter" in str(n.target) and len(n.args) > 5]
    assert sorted(steps) == [2, 2, 3, 4, 4]
    ops = {n.op_type for n in onnx.ModelProto.FromString(contents.onnx).graph.node}
    assert "Gather" in ops and not ops & {"ScatterND", "ScatterElements"}


@pytest.mark.parametrize("tokens", [5, 6, 9, 64])
def test_the_onnx_matches_pytorch(partition, tokens):
    assert_onnx_matches_partition(*partition, tokens, rtol=0, atol=0)


def test_the_real_builder_takes_it(partition):
    engine = onnx_build.parse_and_build(tensorrt_rtx_or_skip(), partition[1], "sm_80")
    assert len(engine.plan) > 0
