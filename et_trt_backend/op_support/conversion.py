"""Dtype casts and copies (TensorRT Cast, Identity and broadcasting Slice layers).

ExecuTorch's edge dialect writes casts and clones as dim_order_ops; only the
contiguous dim order is accepted (TensorRT tensors are dense row-major).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  registers torch.ops.dim_order_ops

from ._common import TENSOR_DTYPES, Rule, check_arg_dtype, check_dtype, first_reason, output_tensors

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops


def _cast(node: Node) -> str | None:
    out = output_tensors(node)
    dim_order = node.kwargs.get("dim_order")
    if dim_order is not None and list(dim_order) != sorted(dim_order):
        return f"non-contiguous dim_order {list(dim_order)} is not supported"
    memory_format = node.kwargs.get("memory_format")
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format {memory_format} is not supported"
    return first_reason(
        check_arg_dtype(node, 0, TENSOR_DTYPES), check_dtype(out[0] if out else None, TENSOR_DTYPES, "result")
    )


def _copy(node: Node) -> str | None:
    # copy(self, src): src broadcast to self's shape, in self's dtype (a functionalized x[...].copy_(src))
    return first_reason(check_arg_dtype(node, 0, TENSOR_DTYPES), check_arg_dtype(node, 1, TENSOR_DTYPES, "src"))


# Casts and copies in any dim-order form (not copy: it broadcasts src into self).
CASTS = frozenset({aten._to_copy.default, aten.clone.default, dim_order_ops._to_dim_order_copy.default,
                   dim_order_ops._clone_dim_order.default})

RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.copy.default: _copy,
    aten._to_copy.default: _cast,
    aten.clone.default: _cast,
    dim_order_ops._to_dim_order_copy.default: _cast,
    dim_order_ops._clone_dim_order.default: _cast,
}
