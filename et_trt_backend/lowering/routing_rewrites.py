"""Graph rewrites that make MoE routing and grouped GEMMs TensorRT-parseable.

Real MoE code routes with ops TensorRT's ONNX parser rejects: a stable argsort
of T*k rows (TopK caps K at TOPK_MAX_K and needs K static), bincount
(data-dependent output size) and index_add / scatter_add /
index_put(accumulate) combines (ScatterND with a reduction). These passes
rewrite the ATen graph in place, without any change to the user's model:

- sort/argsort of integers provably in [0, E) (they come from a top-k over E
  experts) -> `et_trt_lowering.counting_sort` (one-hot + cumsum + a scatter
  without reduction in ONNX; see translations.counting_sort for its memory).
- bincount of such integers with minlength >= E, and histc of them with one
  bin per expert -> `bounded_bincount` (per-token counts for top-k ids).
- combine `out.index_add(0, perm // k, src)` (or scatter_add / index_put with
  accumulate) where perm is a sort's permutation of T*k rows and out has T
  rows -> `out + index_put(zeros, [perm], src).view(T, k, ...).sum(1)`: a
  scatter without reduction (perm has no duplicates) and a reshape-and-sum.
  Other float index_put(accumulate=True) and index_add with a 1-D index are
  left to translations.index_put (a one-hot MatMul adds them).
- `_grouped_mm(a, w.transpose(-2, -1), offs)` -> `grouped_mm(a, w, offs,
  trans_b=True)`, so weights are stored once, as the model holds them.
"""

from __future__ import annotations

import logging
import operator

import torch
from torch._guards import detect_fake_mode

from et_trt_backend.op_support.routing import (
    ARGSORTS,
    SORTS,
    as_floor_division,
    integer_key_bound,
    router_row_width,
    scatter_row_index,
)
from et_trt_backend.source_lines import source_line
from et_trt_backend.tensorrt_limits import TOPK_MAX_K

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .errors import LoweringError

logger = logging.getLogger(__name__)
aten = torch.ops.aten
lowering_ops = torch.ops.et_trt_lowering

# Targets the rewrites replace (when their pattern matches; else LoweringError).
REWRITTEN_TARGETS = frozenset(
    SORTS | {aten.bincount.default, aten.index_add.default, aten.scatter_add.default, aten._grouped_mm.default}
)


class RewriteContext:
    """The program being rewritten: its graph and the values of its constants."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self.graph = program.graph_module.graph
        sig = program.graph_signature
        self._constant_of = {
            **{k: program.state_dict[v] for k, v in sig.inputs_to_buffers.items() if v in program.state_dict},
            **{k: program.constants[v] for k, v in sig.inputs_to_lifted_tensor_constants.items()},
        }
        vals = [n.meta.get("val") for n in self.graph.nodes if n.op == "placeholder"]
        self.fake_mode = detect_fake_mode(vals)

    def constant(self, arg) -> torch.Tensor | int | float | None:
        """The value of a Python scalar or a lifted constant placeholder, else None."""
        if isinstance(arg, (int, float)):
            return arg
        if isinstance(arg, torch.fx.Node) and arg.op == "placeholder":
            return self._constant_of.get(arg.name)
        return None

    def call(self, target, args, kwargs=None) -> torch.fx.Node:
        """Insert `target(*args, **kwargs)` (at the current insert point) with its meta value."""
        kwargs = kwargs or {}
        node = self.graph.call_function(target, tuple(args), kwargs)
        as_val = lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a  # noqa: E731
        with self.fake_mode:
            node.meta["val"] = target(*torch.utils._pytree.tree_map(as_val, args),
                                      **torch.utils._pytree.tree_map(as_val, kwargs))
        return node


def row_width(ids) -> int:
    """k when `ids` are top-k indices [..., k] (distinct within each row) flattened to 1-D, else 1
    (the general form of the counting sort and the counts)."""
    return router_row_width(ids) or 1


def _arguments(node: torch.fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    schema_args = node.target._schema.arguments
    bound = {a.name: a.default_value for a in schema_args if a.has_default_value()}
    bound.update(zip((a.name for a in schema_args), node.args))
    bound.update(node.kwargs)
    return bound


def _sort_args(node: torch.fx.Node) -> tuple[torch.fx.Node, int, bool]:
    bound = _arguments(node)
    return bound["self"], bound["dim"], bound["descending"]


def rewrite_sorts(ctx: RewriteContext) -> None:
    """Sorts of expert ids -> counting sort; other short static sorts -> one TopK (aten.sort.default).

    TopK does not promise a stable order among equal keys; the counting sort is stable.
    """
    for node in list(ctx.graph.nodes):
        if node.target not in SORTS:
            continue
        ids, dim, descending = _sort_args(node)
        shape = ids.meta["val"].shape
        size = shape[dim] if shape else 1
        bins = integer_key_bound(ids)
        if len(shape) == 1 and not descending and bins is not None:
            width = row_width(ids)
            sort, args = lowering_ops.counting_sort.default, (ids, bins, width)
            logger.info("sort %s: counting sort over %d bins (rows of %d)", node.name, bins, width)
        elif isinstance(size, int) and size <= TOPK_MAX_K:
            sort, args = aten.sort.default, (ids, dim, descending)
        else:
            raise LoweringError(
                f"{node.target} ({node.name}) at {source_line(node)}: sorts {size} rows; TensorRT's TopK "
                f"needs a static K <= {TOPK_MAX_K}. et-trt rewrites an ascending 1-D sort into a counting "
                "sort only when its values are the router's expert indices (integers in [0, E) from top-k / max / "
                "argmax, also reshaped, gathered, cast to int or concatenated); sort those, "
                "or keep this sort out of the TensorRT partition"
            )
        if node.target is sort:
            continue
        with ctx.graph.inserting_before(node):
            replacement = ctx.call(sort, args)
            if node.target in ARGSORTS:
                replacement = ctx.call(operator.getitem, (replacement, 1))
        node.replace_all_uses_with(replacement)
        ctx.graph.erase_node(node)


def rewrite_histcs(ctx: RewriteContext) -> None:
    """histc of expert ids with one bin per expert -> bounded_bincount (per-token memory).

    torch.histc(ids.float(), bins=E, min=0, max=E) or max=E - 1 puts id e in bin e.
    Other histcs keep torchlib's form (a [N, bins + 1] comparison with the bin edges).
    """
    for node in list(ctx.graph.nodes):
        if node.target is not aten.histc.default:
            continue
        bound = _arguments(node)
        values, bins, low, high = bound["self"], bound["bins"], bound["min"], bound["max"]
        if integer_key_bound(values) != bins or low != 0 or high not in (bins, bins - 1) or bins < 2:
            continue
        with ctx.graph.inserting_before(node):
            counted = ctx.call(lowering_ops.bounded_bincount.default, (values, bins, row_width(values)))
            counted = ctx.call(aten._to_copy.default, (counted,), {"dtype": node.meta["val"].dtype})
        node.replace_all_uses_with(counted)
        ctx.graph.erase_node(node)
        logger.info("histc %s: one bin per expert, counted per token", node.name)


def rewrite_bincounts(ctx: RewriteContext) -> None:
    for node in list(ctx.graph.nodes):
        if node.target is not aten.bincount.default:
            continue
        ids = node.args[0]
        weights = node.args[1] if len(node.args) > 1 else node.kwargs.get("weights")
        minlength = node.args[2] if len(node.args) > 2 else node.kwargs.get("minlength", 0)
        bins = integer_key_bound(ids)
        if weights is not None or bins is None or minlength < bins:
            raise LoweringError(
                f"bincount ({node.name}) at {source_line(node)}: its output size depends on the data, "
                "which TensorRT rejects. et-trt lowers bincount(ids, minlength=E) of top-k indices over "
                "E experts (no weights); pass minlength=num_experts, or use torch.histc"
            )
        with ctx.graph.inserting_before(node):
            counted = ctx.call(lowering_ops.bounded_bincount.default, (ids, minlength, row_width(ids)))
        node.replace_all_uses_with(counted)
        ctx.graph.erase_node(node)
    _repropagate(ctx)


def _repropagate(ctx: RewriteContext) -> None:
    # bounded_bincount's static size replaces an unbacked one: recompute every
    # meta value downstream so shapes are consistent again.
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = ctx.program.graph_module
    gm.recompile()
    inputs = [n.meta["val"] for n in ctx.graph.nodes if n.op == "placeholder"]
    FakeTensorProp(gm, mode=ctx.fake_mode).propagate_dont_convert_inputs(*inputs)


def _permutation_over_k(ctx: RewriteContext, index) -> tuple[torch.fx.Node, int] | None:
    """(perm, k) when `index` is `perm // k` and perm is the indices of a 1-D sort."""
    found = as_floor_division(index)
    if found is None:
        return None
    perm, divisor = found
    k = ctx.constant(divisor)
    if isinstance(k, torch.Tensor):
        k = int(k.item()) if k.numel() == 1 and not k.is_floating_point() else None
    if not isinstance(k, int) or k <= 0:
        return None
    if not (isinstance(perm, torch.fx.Node) and perm.target is operator.getitem and perm.args[1] == 1
            and perm.args[0].target in SORTS | {lowering_ops.counting_sort.default}
            and perm.meta["val"].dim() == 1):
        return None
    return perm, k


def _combine_args(node: torch.fx.Node):
    """(out, dim, index, src) of an accumulating combine, or None."""
    if node.target is aten.index_add.default:
        out, dim, index, src = node.args[:4]
        alpha = node.args[4] if len(node.args) > 4 else node.kwargs.get("alpha", 1)
        return (out, dim, index, src) if alpha == 1 else None
    if node.target is aten.scatter_add.default:
        out, dim, index, src = node.args
        return out, dim, scatter_row_index(index), src
    if node.target is aten.index_put.default:
        out, indices, src = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate and len(indices) == 1 and indices[0] is not None:
            return out, 0, indices[0], src
    return None


def _index_add_as_index_put(ctx: RewriteContext, node, out, dim: int, index, src) -> None:
    """out.index_add(dim, index, src) -> index_put(out, [None] * dim + [index], src, accumulate=True): the same
    sums, which translations.index_put adds by a one-hot MatMul."""
    dim = dim + out.meta["val"].dim() if dim < 0 else dim
    with ctx.graph.inserting_before(node):
        new = ctx.call(aten.index_put.default, (out, [None] * dim + [index], src, True))
    node.replace_all_uses_with(new)
    ctx.graph.erase_node(node)


def rewrite_combines(ctx: RewriteContext) -> None:
    for node in list(ctx.graph.nodes):
        if node.target not in (aten.index_add.default, aten.scatter_add.default, aten.index_put.default):
            continue
        parts = _combine_args(node)
        if parts is None:
            continue  # index_put without accumulate: a plain scatter TensorRT takes
        out, dim, index, src = parts
        found = _permutation_over_k(ctx, index)
        out_val, src_val = out.meta["val"], src.meta["val"]
        if (found is None or dim != 0 or src_val.shape[0] != out_val.shape[0] * found[1]
                or tuple(src_val.shape[1:]) != tuple(out_val.shape[1:])
                or not all(isinstance(s, int) for s in src_val.shape[1:])):
            if node.target is aten.index_put.default:
                continue  # another x[idx] += v: translations.index_put adds it by a one-hot MatMul
            one_index = index.meta["val"].dim() == 1
            if node.target is aten.index_add.default and out_val.dtype.is_floating_point and one_index:
                _index_add_as_index_put(ctx, node, out, dim, index, src)
                continue
            raise LoweringError(
                f"{node.target} ({node.name}) at {source_line(node)}: an accumulating scatter "
                "(ScatterND with a reduction) is rejected by TensorRT. et-trt rewrites the top-k combine "
                "out.index_add(0, perm // k, src) (also scatter_add / index_put(accumulate=True)) where "
                "perm = argsort(top-k expert ids) and out has T = len(perm) / k rows; other forms need a "
                "model change, e.g. src[inverse_perm].view(T, k, -1).sum(1)"
            )
        perm, k = found
        with ctx.graph.inserting_before(node):
            zeros = ctx.call(aten.zeros_like.default, (src,))
            unsorted = ctx.call(aten.index_put.default, (zeros, [perm], src, False))
            grouped = ctx.call(aten.view.default, (unsorted, [-1, k, *src_val.shape[1:]]))
            summed = ctx.call(aten.sum.dim_IntList, (grouped, [1]))
            combined = ctx.call(aten.add.Tensor, (out, summed))
        node.replace_all_uses_with(combined)
        ctx.graph.erase_node(node)
        logger.info("combine %s: unpermute + reshape-and-sum over k=%d", node.name, k)


def _transposed_weight(b: torch.fx.Node) -> torch.fx.Node | None:
    """w when b is w with its last two dims swapped (3-D), else None."""
    if b.target is aten.permute.default and list(b.args[1]) == [0, 2, 1]:
        return b.args[0]
    if b.target is aten.transpose.int and sorted(d % 3 for d in b.args[1:3]) == [1, 2]:
        return b.args[0]
    return None


def rewrite_grouped_mms(ctx: RewriteContext) -> None:
    for node in list(ctx.graph.nodes):
        if node.target is not aten._grouped_mm.default:
            continue
        a, b = node.args[:2]
        offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
        bias = node.args[3] if len(node.args) > 3 else node.kwargs.get("bias")
        out_dtype = node.args[4] if len(node.args) > 4 else node.kwargs.get("out_dtype")
        a_val, b_val = a.meta["val"], b.meta["val"]
        if (a_val.dim() != 2 or b_val.dim() != 3 or offs is None or bias is not None
                or out_dtype not in (None, a_val.dtype)):
            raise LoweringError(
                f"_grouped_mm ({node.name}) at {source_line(node)}: et-trt lowers the MoE form "
                "_grouped_mm(a [rows, K], b [G, K, N], offs [G]) without bias or out_dtype; got a "
                f"{a_val.dim()}-D, b {b_val.dim()}-D, offs {'given' if offs is not None else 'missing'}"
            )
        weight = _transposed_weight(b)
        trans_b = weight is not None
        with ctx.graph.inserting_before(node):
            new = ctx.call(lowering_ops.grouped_mm.default, (a, weight if trans_b else b, offs, trans_b))
        new.meta = {**node.meta, "val": new.meta["val"]}  # the model's module path and source line stay
        node.replace_all_uses_with(new)
        ctx.graph.erase_node(node)


def rewrite(program: torch.export.ExportedProgram) -> None:
    """Apply every rewrite to an ATen program (in place) and drop dead nodes."""
    ctx = RewriteContext(program)
    rewrite_grouped_mms(ctx)
    # Counts first: integer_key_bound follows a sort's values back to the router, not a counting sort's.
    rewrite_histcs(ctx)
    if any(n.target is aten.bincount.default for n in ctx.graph.nodes):
        rewrite_bincounts(ctx)
    rewrite_sorts(ctx)
    rewrite_combines(ctx)
    ctx.graph.eliminate_dead_code()
    program.graph_module.recompile()
