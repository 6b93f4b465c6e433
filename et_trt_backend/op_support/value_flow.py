"""Ops a tensor's values pass through unchanged: the one list the partitioner and the lowering share.

Routing code reaches its sort and its counts through such ops (`ids.view(-1)`,
`ids.float()` for histc, `torch.cat` of two max results, ids gathered by a
permutation). The partitioner's rules (routing.py) and the lowering's rewrites
(lowering/routing_rewrites.py) both follow them back to the router, to learn that the
ids are integers in [0, E) and how they are laid out in rows. Each set holds
the edge forms (`*_copy` and dim-order ops: the partitioner's graphs) and the
ATen forms (the lowering's graphs, after lowering/to_aten.py).
"""

from __future__ import annotations

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  registers torch.ops.dim_order_ops

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops

# Casts (edge, decomposed ATen, and torch.export's `x.to(dtype)`): the value passes unchanged
# when the target dtype holds it (is_exact_cast).
CASTS = frozenset({aten._to_copy.default, dim_order_ops._to_dim_order_copy.default, aten.to.dtype})

# Dtypes that hold every integer a router produces (expert ids < 2**24) exactly.
EXACT_CAST_DTYPES = frozenset({torch.int32, torch.int64, torch.float32, torch.float64})

# Same elements in the same row-major order: reshapes, copies and casts. Rows of
# top-k ids stay rows of k consecutive elements through these.
ROW_MAJOR = CASTS | {
    aten.view.default, aten.view_copy.default, aten.reshape.default, aten._unsafe_view.default,
    aten.flatten.using_ints, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
    aten.unsqueeze.default, aten.unsqueeze_copy.default, aten.clone.default, dim_order_ops._clone_dim_order.default,
    aten.contiguous.default, aten.alias.default, aten.alias_copy.default, aten.detach.default,
}

# The output holds some of the first input's values (reordered, broadcast, a part of
# them, or picked by an index): integers in [0, E) stay in [0, E).
VALUE_SUBSET = ROW_MAJOR | {
    aten.permute.default, aten.permute_copy.default, aten.transpose.int, aten.transpose_copy.int,
    aten.t.default, aten.t_copy.default, aten.expand.default, aten.expand_copy.default,
    aten.select.int, aten.select_copy.int, aten.slice.Tensor, aten.slice_copy.Tensor,
    aten.gather.default, aten.index_select.default, aten.index.Tensor,
}

# The output holds some of the values of every input tensor (a list, the first argument).
CONCATS = frozenset({aten.cat.default})

# Ops that broadcast a row index over the features (scatter_add's index argument).
BROADCASTING = frozenset({
    aten.expand.default, aten.expand_copy.default, aten.unsqueeze.default, aten.unsqueeze_copy.default,
    aten.view.default, aten.view_copy.default, aten.reshape.default,
})


def is_exact_cast(node: torch.fx.Node) -> bool:
    """Whether a cast node keeps router integers exact (no dtype given: unchanged)."""
    dtype = node.kwargs.get("dtype", node.args[1] if len(node.args) > 1 else None)
    return dtype is None or dtype in EXACT_CAST_DTYPES
