"""A lifted constant used by two partitions (Diffusion Policy's scheduler table, read by every denoising
step) lowers in both: ExecuTorch hands each partition its own placeholder for it under one target name,
which PyTorch's unlifting inside the ONNX exporter refused ("`lifted_tensor_0` is not a buffer")."""

from __future__ import annotations

import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_partitioner import TensorRTPartitioner
from support.lowering import assert_onnx_matches_partition, delegated_parts


class _Scaled(torch.nn.Module):
    def __init__(self, table: list[torch.Tensor]):
        super().__init__()
        self.table = table  # a plain attribute, not a buffer: torch.export lifts it as a constant

    def forward(self, x):
        return x * self.table[0][3] + self.table[0][5]


class _TwoParts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        table = [torch.linspace(0.1, 1.0, 10)]
        self.first, self.second = _Scaled(table), _Scaled(table)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def test_a_constant_shared_by_two_partitions_lowers_in_both():
    torch.manual_seed(0)
    exported = torch.export.export(_TwoParts(), (torch.randn(4, 8),))
    assert len(exported.constants) == 1
    # Partitions never span parts whose options differ: `second` is a partition of its own.
    recipe = {"default": {"precision": "fp32", "engine_build": "never"}, "parts": {"second": {"optimization_level": 5}}}
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe)])
    parts = delegated_parts(edge)
    assert len(parts) == 2
    for program, contents in parts:
        assert_onnx_matches_partition(program, contents, tokens=4)
