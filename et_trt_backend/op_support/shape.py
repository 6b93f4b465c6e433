"""Shape and layout ops (TensorRT Shuffle, Slice, Concatenation, Shape and Scatter layers).

Edge programs carry the *_copy forms of view ops; the lowering treats them as
views. Sizes may be symbolic (computed from the dynamic dimensions at run
time); split sizes and slice steps must be static.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import (
    TENSOR_DTYPES,
    Rule,
    check_arg_dtype,
    computed_dtype,
    first_reason,
    is_static,
    rule_dtypes,
    static_ints,
)

aten = torch.ops.aten

_any = rule_dtypes(TENSOR_DTYPES)


def _split(node: Node) -> str | None:
    sizes = node.args[1]
    if not (is_static(sizes) or static_ints(sizes)):
        return "split sizes must be static"
    return check_arg_dtype(node, 0, TENSOR_DTYPES)


def _slice(node: Node) -> str | None:
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    if not is_static(step) or step < 1:
        return f"slice step must be a static positive int, got {step!r}"
    return check_arg_dtype(node, 0, TENSOR_DTYPES)


def _slice_scatter(node: Node) -> str | None:
    # src written into a slice of self (a functionalized x[..., a:b:step] = src): Slice + Concat for step 1,
    # a Gather of src and a Where for other steps
    step = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
    if not is_static(step) or step < 1:
        return f"slice_scatter step must be a static positive int, got {step!r}"
    return first_reason(check_arg_dtype(node, 0, TENSOR_DTYPES), check_arg_dtype(node, 1, TENSOR_DTYPES, "src"))


def _cat(node: Node) -> str | None:
    tensors = [t for t in node.args[0] if isinstance(t, Node)]
    dtypes = {computed_dtype(t.meta["val"].dtype) for t in tensors if isinstance(t.meta.get("val"), torch.Tensor)}
    if len(dtypes) > 1:
        return "inputs of cat have different dtypes; cast them to one dtype first"
    if dtypes and not dtypes <= TENSOR_DTYPES:
        return f"cat of {dtypes.pop()} tensors is not supported"
    return None


# Views (edge programs hold their *_copy forms): a partition of nothing else only moves data.
VIEWS = frozenset({aten.view_copy.default, aten.permute_copy.default, aten.expand_copy.default,
                   aten.unsqueeze_copy.default, aten.squeeze_copy.dims, aten.squeeze_copy.dim, aten.select_copy.int,
                   aten.slice_copy.Tensor, aten.alias_copy.default})

RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.view_copy.default: _any,
    aten.permute_copy.default: _any,
    aten.expand_copy.default: _any,
    aten.unsqueeze_copy.default: _any,
    aten.squeeze_copy.dims: _any,
    aten.squeeze_copy.dim: _any,
    aten.select_copy.int: _any,
    aten.slice_copy.Tensor: _slice,
    aten.slice_scatter.default: _slice_scatter,
    aten.split_with_sizes_copy.default: _split,
    aten.split_copy.Tensor: _split,
    aten.alias_copy.default: _any,
    aten.cat.default: _cat,
    aten.repeat.default: _any,
    aten.flip.default: _any,
    aten.sym_size.int: lambda node: None,
}
