"""MoE routing ops: top-k, sorts, expert counts, offsets, scatters.

TensorRT limits that shape these rules (and the lowering's rewrites,
et_trt_backend/lowering/routing_rewrites.py, which they mirror):
- TopK takes a static K <= TOPK_MAX_K and is not stable. A sort becomes one
  TopK when its axis is static and at most TOPK_MAX_K long. An ascending 1-D
  sort of expert ids (integers in [0, E) from the router's top-k / max /
  argmax, also after ops that pass values unchanged: reshapes, gathers, casts
  to int, a cat of such ids; value_flow.py) becomes a stable counting sort
  instead, with no length limit; `integer_key_bound` finds E.
- CumSum runs on float tensors: integer counts are summed in float32 (exact
  below 2**24) and cast back.
- TensorRT has no accumulating scatter (ScatterND takes no reduction, and
  ScatterElements with one is a plugin the runtime does not load). The MoE
  combine `out.index_add(0, perm // k, rows)` (or scatter_add /
  index_put(accumulate=True) of that form, its index perm // k also reshaped
  or cast) is rewritten as un-permute + reshape + sum over k;
  `is_topk_combine` recognises it, reading the index as the rewrite does
  (`as_floor_division`). A float index_put(accumulate=True) by one 1-D index
  on any dimension (and index_add, which edge programs hand over as one) is
  summed by a one-hot MatMul instead; other accumulating scatters are refused.
- bincount is lowered for expert ids with minlength >= E (its size is then
  static); other data-dependent sizes (nonzero, unique) have no TensorRT form.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from et_trt_backend.tensorrt_limits import TOPK_MAX_K

from . import value_flow
from .indexing import index_tensors_reason
from ._common import (
    BOOL_DTYPES,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    INT_DTYPES,
    NUMERIC_DTYPES,
    Rule,
    arg_tensor,
    aten_overload,
    bound_args,
    check_arg_dtype,
    check_dtype,
    first_reason,
    is_static,
    normalize_dim,
)

aten = torch.ops.aten

ARGSORTS = frozenset({aten.argsort.default, aten.argsort.stable})
SORTS = ARGSORTS | {aten.sort.default, aten.sort.stable}

# Ops that pick experts: their indices are expert ids. topk and max.dim return
# (values, indices), argmax the indices alone.
_ROUTERS_WITH_VALUES = frozenset({aten.topk.default, aten.max.dim})
ROUTER_OPS = _ROUTERS_WITH_VALUES | {aten.argmax.default}

# Floor divisions (ATen and edge forms; the *_mode ones only with rounding_mode="floor"):
# a combine's `perm // k` turns positions among the sorted top-k rows into token rows.
FLOOR_DIVISIONS = frozenset(
    {aten.floor_divide.default, aten.floor_divide.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode}
)


def _target(node: object) -> object:
    return aten_overload(node.target) if isinstance(node, Node) and node.op == "call_function" else None


def _arg(node: Node, index: int, name: str, default: object) -> object:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _router_indices(node: object) -> tuple[Node, int] | None:
    """(router op, dim) when `node` is the indices output of a top-k, max over a dim, or argmax."""
    target = _target(node)
    if target is operator.getitem and node.args[1] == 1 and _target(node.args[0]) in _ROUTERS_WITH_VALUES:
        source = node.args[0]
        default_dim, dim_index = (-1, 2) if _target(source) is aten.topk.default else (0, 1)
        return source, _arg(source, dim_index, "dim", default_dim)
    if target is aten.argmax.default and _arg(node, 1, "dim", None) is not None:
        return node, _arg(node, 1, "dim", None)
    return None


def integer_key_bound(key: object) -> int | None:
    """E when `key` holds expert ids (integers in [0, E) from the router), else None.

    Follows the ops that pass values unchanged (value_flow: reshapes, subsets,
    gathers, exact casts), concatenations of such ids (E: the largest of their
    bounds) and a sort's values back to the indices of a top-k, max or argmax
    over a static dimension of size E. The lowering's rewrites use it too (on
    ATen graphs), so both accept the same routers.
    """
    node = key
    while True:
        target = _target(node)
        if target in value_flow.CASTS and not value_flow.is_exact_cast(node):
            return None  # a narrow float rounds large ids
        if target in value_flow.VALUE_SUBSET:
            node = node.args[0]
        elif target is operator.getitem and node.args[1] == 0 and _target(node.args[0]) in SORTS:
            node = node.args[0].args[0]  # sorted values of expert ids are expert ids
        elif target in value_flow.CONCATS:
            bounds = [integer_key_bound(part) for part in node.args[0]]
            return max(bounds) if bounds and None not in bounds else None
        else:
            break
    found = _router_indices(node)
    if found is None:
        return None
    router, dim = found
    x = arg_tensor(router, 0)
    size = x.shape[normalize_dim(dim, x.dim())] if x is not None else None
    return size if is_static(size) else None


def router_row_width(key: object) -> int | None:
    """k when `key` is the router's top-k indices over the last dim ([..., k] rows of distinct ids),
    kept in row-major order (possibly flattened); 1 for max / argmax indices (one per row); else None."""
    node = key
    while _target(node) in value_flow.ROW_MAJOR:
        node = node.args[0]
    found = _router_indices(node)
    if found is None:
        return None
    router, dim = found
    if _target(router) is not aten.topk.default:
        return 1  # one index per row, whatever the shape (max / argmax with or without keepdim)
    indices = node.meta["val"]
    if indices.dim() == 0 or normalize_dim(dim, indices.dim()) != indices.dim() - 1:
        return None
    width = indices.shape[-1]
    return width if is_static(width) else None


def scatter_row_index(index: object) -> object:
    """The row index that scatter_add's `index` broadcasts over the features."""
    while _target(index) in value_flow.BROADCASTING:
        index = index.args[0]
    return index


def as_floor_division(index: object) -> tuple[Node, object] | None:
    """(perm, k) when `index` is `perm // k`, possibly reshaped or exactly cast (value_flow.ROW_MAJOR:
    every element stays in its place); k as the graph holds it, an int or a constant's node.

    The MoE combine's row index: the op support rules (what the partitioner claims) and the
    lowering's combine rewrite both read perm and k through this, so they accept the same forms.
    """
    while _target(index) in value_flow.ROW_MAJOR:
        if _target(index) in value_flow.CASTS and not value_flow.is_exact_cast(index):
            return None
        index = index.args[0]
    # floor_divide has no rounding_mode; div's *_mode overloads must say "floor".
    if _target(index) not in FLOOR_DIVISIONS or index.kwargs.get("rounding_mode", "floor") != "floor":
        return None
    return index.args[0], index.args[1]


def _sort_keys(perm: object) -> Node | None:
    """The keys a permutation sorts: `perm` is argsort(keys) or sort(keys)[1]."""
    if _target(perm) in ARGSORTS:
        return perm.args[0]
    if _target(perm) is operator.getitem and perm.args[1] == 1 and _target(perm.args[0]) in SORTS:
        return perm.args[0].args[0]
    return None


def is_topk_combine(out: Node, dim: int, index: Node, src: Node) -> bool:
    """True for the MoE combine out.index_add(0, perm // k, src), perm sorting top-k expert ids."""
    found = as_floor_division(index)
    if dim != 0 or found is None:
        return False
    keys = _sort_keys(found[0])
    k = router_row_width(keys) if keys is not None else None
    if k is None or integer_key_bound(keys) is None:
        return False
    out_val, src_val = out.meta.get("val"), src.meta.get("val")
    if not isinstance(out_val, torch.Tensor) or not isinstance(src_val, torch.Tensor):
        return False
    features_match = tuple(src_val.shape[1:]) == tuple(out_val.shape[1:]) and all(
        is_static(s) for s in src_val.shape[1:]
    )
    return features_match and statically_known_true(src_val.shape[0] == out_val.shape[0] * k)


_COMBINE_ADVICE = (
    "TensorRT has no accumulating scatter; et-trt lowers only the MoE combine out.index_add(0, perm // k, rows) "
    "(or scatter_add / index_put(accumulate=True) of that form, perm = argsort of the top-k expert ids); "
    "otherwise write rows[inverse_perm].view(T, k, -1).sum(1)"
)


def _topk(node: Node) -> str | None:
    k = node.args[1]
    if not is_static(k):
        return "k must be a static int"
    if k > TOPK_MAX_K:
        return f"k={k} exceeds TensorRT's TopK limit of {TOPK_MAX_K}"
    return check_arg_dtype(node, 0, NUMERIC_DTYPES)


def _sort(node: Node) -> str | None:
    keys = arg_tensor(node, 0)
    if keys is None:
        return "sort input must be a tensor"
    reason = check_dtype(keys, NUMERIC_DTYPES, "sort keys")
    if reason:
        return reason
    dim, descending = bound_args(node, "dim", "descending")
    if keys.dim() == 1 and not descending and keys.dtype in INT_DTYPES and integer_key_bound(node.args[0]) is not None:
        return None  # stable counting sort over the experts: any length
    size = keys.shape[normalize_dim(dim, keys.dim())] if keys.dim() else 1
    if is_static(size) and size <= TOPK_MAX_K:
        return None  # one TopK
    return (
        f"sorts {size} elements; TensorRT's TopK needs a static length <= {TOPK_MAX_K}. Ascending 1-D sorts of "
        "expert ids from the router's topk/max/argmax (reshaped, gathered, cast to int or concatenated) have no limit "
        "(counting sort): sort those"
    )


def _histc(node: Node) -> str | None:
    bins = _arg(node, 1, "bins", 100)
    lo, hi = _arg(node, 2, "min", 0), _arg(node, 3, "max", 0)
    if not is_static(bins) or bins < 1:
        return "bins must be a static positive int"
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or not lo < hi:
        return "histc needs static min < max (e.g. min=0, max=num_experts - 1); data-derived ranges are not supported"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _bincount(node: Node) -> str | None:
    bins = integer_key_bound(node.args[0])
    minlength = _arg(node, 2, "minlength", 0)
    if _arg(node, 1, "weights", None) is not None or bins is None or not is_static(minlength) or minlength < bins:
        return (
            "bincount's output length depends on the data; et-trt lowers bincount(ids, minlength=num_experts) "
            "of the router's expert ids (no weights), or count with "
            "torch.histc(ids.float(), bins=num_experts, min=0, max=num_experts - 1)"
        )
    return None


def _cumsum(node: Node) -> str | None:
    # bool too: mask code counts flags ((position_diff != 1).cumsum(-1) finds packed sequences)
    return check_arg_dtype(node, 0, NUMERIC_DTYPES | BOOL_DTYPES)


def _scatter(node: Node) -> str | None:
    src = node.args[3] if len(node.args) > 3 else None
    return first_reason(
        check_arg_dtype(node, 0, NUMERIC_DTYPES),
        check_arg_dtype(node, 2, INDEX_DTYPES, "index"),
        check_dtype(src.meta.get("val"), NUMERIC_DTYPES, "src") if isinstance(src, Node) else None,
    )


def _scatter_add(node: Node) -> str | None:
    out, dim, index, src = node.args[:4]
    combine = is_topk_combine(out, dim, scatter_row_index(index), src)
    return _scatter(node) or (None if combine else _COMBINE_ADVICE)


def _index_put(node: Node) -> str | None:
    """x[..., idx, ...] = v on any dimensions (adjacent index tensors, as ScatterND); with accumulate, the MoE
    combine, or a float x[..., idx, ...] += v by one 1-D index (a one-hot MatMul adds the duplicates)."""
    indices = list(node.args[1])
    reason = first_reason(
        index_tensors_reason(indices, "index_put with a boolean mask is not supported; use torch.where(mask, values, x)"),
        check_arg_dtype(node, 0, NUMERIC_DTYPES), check_arg_dtype(node, 2, NUMERIC_DTYPES, "values"))
    if reason or not _arg(node, 3, "accumulate", False):
        return reason
    if len(indices) == 1 and is_topk_combine(node.args[0], 0, indices[0], node.args[2]):
        return None
    present = [i for i in indices if i is not None]
    if len(present) > 1 or present[0].meta["val"].dim() != 1:
        return ("index_put(accumulate=True) is lowered for one 1-D index tensor (x[:, idx] += v); "
                f"{_COMBINE_ADVICE}")
    return check_arg_dtype(node, 0, FLOAT_DTYPES, "accumulated tensor (TensorRT adds duplicates by a float MatMul)")


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort,
    aten.argsort.default: _sort,
    aten.argsort.stable: _sort,
    aten.histc.default: _histc,
    aten.bincount.default: _bincount,
    aten.cumsum.default: _cumsum,
    aten.scatter.src: _scatter,
    aten.scatter.value: _scatter,
    aten.scatter_add.default: _scatter_add,
    aten.index_put.default: _index_put,
}

# Ops refused with a specific hint (their output size depends on the data, or TensorRT lacks them).
BLOCKED_ADVICE: dict[torch._ops.OpOverload, str] = {
    aten.nonzero.default: "nonzero has a data-dependent size; keep every expert and use offsets/masks instead",
    aten.unique_consecutive.default: "unique has a data-dependent size; use histc counts instead",
    aten._unique2.default: "unique has a data-dependent size; use histc counts instead",
    aten.masked_select.default: "masked_select has a data-dependent size; use torch.where instead",
    aten.scatter_reduce.two: "scatter_reduce needs a reducing scatter, which TensorRT lacks; " + _COMBINE_ADVICE,
}
