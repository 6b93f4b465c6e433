"""Max, average and adaptive average pooling (TensorRT Pooling layers; adaptive: two MatMuls).

F.max_pool*d becomes max_pool{2,3}d_with_indices in an edge program (1-D through a 2-D one). TensorRT's
MaxPool has no indices output, so it is lowered only where the indices are unused (the lowering then
writes the single-output form, lowering/single_outputs.py). adaptive_avg_pool to size 1 arrives as a mean;
other sizes as _adaptive_avg_pool2d, lowered for static spatial sizes (translations.adaptive_avg_pool2d).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, arg_tensor, bound_args, check_arg_dtype, is_static

aten = torch.ops.aten


def _ones(values) -> bool:
    return all(v == 1 for v in ([values] if isinstance(values, int) else values))


def _max_pool(node: Node) -> str | None:
    (dilation,) = bound_args(node, "dilation")
    if not _ones(dilation):
        return (f"max pooling with dilation {list(dilation)}: TensorRT's pooling has no dilation; pool without "
                "dilation (or dilate with a strided slice first)")
    uses = [user for user in node.users if user.target is operator.getitem and user.args[1] == 1 and user.users]
    if uses:
        return (f"the indices of max pooling are used (by {uses[0].name}); TensorRT's MaxPool returns the pooled "
                "values only: call F.max_pool without return_indices=True")
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _avg_pool(node: Node) -> str | None:
    (divisor_override,) = bound_args(node, "divisor_override")
    if divisor_override is not None:
        return (f"avg_pool with divisor_override={divisor_override}: TensorRT divides by the window size; "
                "drop divisor_override and scale the result instead")
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _adaptive_avg_pool(node: Node) -> str | None:
    x = arg_tensor(node, 0)
    if x is not None and not all(is_static(s) for s in x.shape[-2:]):
        return "adaptive average pooling over a dynamic height or width: the pooling windows must be static"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.max_pool3d_with_indices.default: _max_pool,
    aten.avg_pool2d.default: _avg_pool,
    aten.avg_pool3d.default: _avg_pool,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool,
}
