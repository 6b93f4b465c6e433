"""Ops whose output size depends on the data (nonzero, boolean-mask indexing) and everything computed from their
results stay on ExecuTorch with a reason; the rest of the program is still delegated and lowered (issue 31,
item 5: such programs used to be partitioned and crash inside torch.onnx with PendingUnbackedSymbolNotFound)."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend import op_support
from et_trt_backend.op_support import aten_overload
from et_trt_partitioner import TensorRTPartitioner
from support.lowering import delegated_parts

aten = torch.ops.aten


class _Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).float().sum() + x.sum(), x * 2


class _MaskIndex(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].exp().sum() * x


def _outside(edge) -> dict[str, str | None]:
    """Each compute op left to ExecuTorch, with the support rule's reason (by op name)."""
    return {str(aten_overload(n.target)): op_support.unsupported_reason(n)
            for n in edge.exported_program().graph.nodes
            if n.op == "call_function" and isinstance(aten_overload(n.target), torch._ops.OpOverload)
            and "executorch_call_delegate" not in str(n.target)}


@pytest.mark.parametrize("model, producer, consumer", [
    (_Nonzero(), "aten.nonzero.default", "dim_order_ops._to_dim_order_copy.default"),
    (_MaskIndex(), "aten.index.Tensor", "aten.exp.default"),
], ids=["nonzero", "mask-index"])
def test_data_dependent_ops_stay_on_executorch(model, producer, consumer):
    x = torch.randn(6)
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[TensorRTPartitioner()])
    outside = _outside(edge)
    # The op making the data-dependent size and its consumer, with the size named in the reason.
    assert producer in outside and consumer in outside, outside
    assert "depends on the data" in outside[consumer] and "u" in outside[consumer]
    # The ops around them are delegated, and lowered.
    parts = delegated_parts(edge)
    assert len(parts) == 2
    assert all(contents.onnx for _, contents in parts)
