"""MoE routing ops: top-k, sorts, expert counts, offsets, scatters.

TensorRT limits that shape these rules:
- TopK (also the usual way to sort) takes K <= TOPK_MAX_K and is not stable.
  Float keys are sorted through TopK, so their axis must be bounded by
  TOPK_MAX_K. Integer keys whose range is known (expert ids: indices from a
  top-k over E experts) may be sorted by counting (one-hot + cumsum) instead,
  which has no length limit; `integer_key_bound` finds that range.
- CumSum runs on float tensors: integer counts are summed in float32 (exact
  below 2**24) and cast back.
- ScatterND has no reduction; accumulating scatters (index_put with
  accumulate=True, scatter_add) need ScatterElements with reduction="add".
- Ops whose output size depends on the data (bincount, nonzero, unique) have
  no TensorRT form; BLOCKED_ADVICE says what to write instead.
"""

from __future__ import annotations

import operator

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  registers torch.ops.dim_order_ops
from torch.fx import Node

from ._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    INT_DTYPES,
    NUMERIC_DTYPES,
    Rule,
    arg_tensor,
    aten_overload,
    check_arg_dtype,
    check_dtype,
    first_reason,
    is_static,
    normalize_dim,
    upper_bound,
)

aten = torch.ops.aten

TOPK_MAX_K = 3840  # TensorRT ITopKLayer's largest K

# Ops that only reshape or relabel a tensor without changing its values' range.
_VALUE_PRESERVING = {
    aten.view_copy.default,
    aten.reshape.default,
    aten.view.default,
    aten.flatten.using_ints,
    aten.permute_copy.default,
    aten.clone.default,
    aten._to_copy.default,
}


def integer_key_bound(key: Node) -> int | None:
    """Exclusive upper bound of integer sort keys that are expert ids, else None.

    Follows reshapes and casts back to the indices output of a top-k over a
    static dimension of size E (the router's experts): keys are then in [0, E).
    """
    node = key
    for _ in range(16):  # reshape/cast chains are short
        if not isinstance(node, Node) or node.op != "call_function":
            return None
        target = aten_overload(node.target)
        if target in _VALUE_PRESERVING or target is torch.ops.dim_order_ops._to_dim_order_copy.default:
            node = node.args[0]
            continue
        if target is operator.getitem and node.args[1] == 1:
            source = node.args[0]
            if isinstance(source, Node) and aten_overload(source.target) is aten.topk.default:
                x = arg_tensor(source, 0)
                dim = source.args[2] if len(source.args) > 2 else source.kwargs.get("dim", -1)
                size = x.shape[normalize_dim(dim, x.dim())] if x is not None else None
                return size if is_static(size) else None
        return None
    return None


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
    dim = node.kwargs.get("dim", -1)
    if keys.dtype in INT_DTYPES and integer_key_bound(node.args[0]) is not None:
        return None  # counting sort over a known expert range: any length
    length = upper_bound(keys.shape[normalize_dim(dim, keys.dim())] if keys.dim() else 1)
    if length is None or length > TOPK_MAX_K:
        shown = "unbounded" if length is None else str(length)
        return (
            f"sorts up to {shown} elements, more than TensorRT's TopK limit of {TOPK_MAX_K}; "
            "sort expert ids that come straight from the router's topk (their range is then known), "
            "or bound the dynamic dimension with torch.export.Dim(..., max=...)"
        )
    return None


def _histc(node: Node) -> str | None:
    bins = node.args[1] if len(node.args) > 1 else node.kwargs.get("bins", 100)
    lo = node.args[2] if len(node.args) > 2 else node.kwargs.get("min", 0)
    hi = node.args[3] if len(node.args) > 3 else node.kwargs.get("max", 0)
    if not is_static(bins) or bins < 1:
        return "bins must be a static positive int"
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or not lo < hi:
        return "histc needs static min < max (e.g. min=0, max=num_experts - 1); data-derived ranges are not supported"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _cumsum(node: Node) -> str | None:
    return check_arg_dtype(node, 0, NUMERIC_DTYPES)


def _scatter(node: Node) -> str | None:
    src = node.args[3] if len(node.args) > 3 else None
    return first_reason(
        check_arg_dtype(node, 0, NUMERIC_DTYPES),
        check_arg_dtype(node, 2, INDEX_DTYPES, "index"),
        check_dtype(src.meta.get("val"), NUMERIC_DTYPES, "src") if isinstance(src, Node) else None,
    )


def _scatter_reduce(node: Node) -> str | None:
    reduce = node.args[4]
    include_self = node.kwargs.get("include_self", True)
    if reduce not in ("sum", "prod", "amax", "amin"):
        return f"scatter_reduce with reduce={reduce!r} is not supported (sum, prod, amax, amin are)"
    if not include_self:
        return "scatter_reduce with include_self=False is not supported"
    return _scatter(node)


def _index_put(node: Node) -> str | None:
    indices = node.args[1]
    if len(indices) != 1 or indices[0] is None:
        return "index_put is lowered for one index tensor on dimension 0 (x[idx] = v or x.index_add_(0, ...))"
    index = indices[0].meta.get("val") if isinstance(indices[0], Node) else None
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        return "index_put with a boolean mask is not supported; use torch.where"
    return first_reason(
        check_dtype(index, INDEX_DTYPES, "index"),
        check_arg_dtype(node, 0, NUMERIC_DTYPES),
        check_arg_dtype(node, 2, NUMERIC_DTYPES, "values"),
    )


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort,
    aten.argsort.default: _sort,
    aten.argsort.stable: _sort,
    aten.histc.default: _histc,
    aten.cumsum.default: _cumsum,
    aten.scatter.src: _scatter,
    aten.scatter.value: _scatter,
    aten.scatter_add.default: _scatter,
    aten.scatter_reduce.two: _scatter_reduce,
    aten.index_put.default: _index_put,
}

# Ops refused with a specific hint (their output size depends on the data).
BLOCKED_ADVICE: dict[torch._ops.OpOverload, str] = {
    aten.bincount.default: (
        "bincount's output length depends on the data; count experts with "
        "torch.histc(ids.float(), bins=num_experts, min=0, max=num_experts - 1)"
    ),
    aten.nonzero.default: "nonzero has a data-dependent size; keep every expert and use offsets/masks instead",
    aten.unique_consecutive.default: "unique has a data-dependent size; use histc counts instead",
    aten._unique2.default: "unique has a data-dependent size; use histc counts instead",
    aten.masked_select.default: "masked_select has a data-dependent size; use torch.where instead",
}
