"""Rows under a boolean mask whose number the program fixes: read and written by rank, with an engine check.

masked_rows.py makes `out[mask] = f(x[mask])` dense. Two forms are left that
it cannot make dense, both in WALL-OSS's flow-matching step (lerobot 0.4.4,
wall_x/modeling_wall_x.py, `predict`'s `step`), where the action tokens of the
prompt take the action embeddings and give back the action predictions:

    embeds[action_mask] = action_embed               # values of a static row count N
    pred = proj(hidden[action_mask]).reshape(B, H, A)  # rows whose count the program asserts is N

The number of True entries is data, but the program fixes it: index_put of N
value rows needs exactly N (PyTorch refuses another number), and torch.export
records `Eq(rows, N)` for a selection later reshaped to N rows (its value then
has N rows). So the k-th True entry takes value row k (its rank: a cumulative
sum), and the selection is the N positions of ranks 1..N (an argmax over a
[N, entries] comparison): static shapes, TensorRT's. Where the input's mask has
another number of True entries the program is wrong for it; the rewrite adds
`_assert_async(mask.sum() == N, message)`, which the lowering turns into an
engine check (lowering/checks.py): the delegate fails that call with the
message. Such an input reads nothing out of bounds either: value rows are taken
by rank mod N, selected positions are an argmax's. One value row (or values broadcast over the rows) is written to any number of
rows, as PyTorch does: no check.
"""

from __future__ import annotations

import logging

import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import is_concrete_int, statically_known_true

from et_trt_backend.op_support import node_value
from et_trt_backend.source_lines import portable_source_line

from .masked_rows import mask_of, replace_put

logger = logging.getLogger(__name__)

aten = torch.ops.aten


class _Builder:
    """Adds ATen calls before `anchor`, each carrying its module and source line (for messages and inspect)."""

    def __init__(self, graph: torch.fx.Graph, anchor: Node):
        self.graph, self.anchor = graph, anchor
        self.origin = {k: anchor.meta[k] for k in ("nn_module_stack", "stack_trace") if k in anchor.meta}

    def __call__(self, target, *args, **kwargs) -> Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        node.meta.update(self.origin)
        return node


def _entries(call: _Builder, mask: Node) -> tuple[Node, Node, Node]:
    """The mask flattened (one entry per selectable row), the same as int64 ones and zeros, and each entry's rank:
    1 for the first True, ..."""
    flat = call(aten.reshape.default, mask, [-1])
    ones = call(aten._to_copy.default, flat, dtype=torch.int64)
    return flat, ones, call(aten.cumsum.default, ones, 0)


def _check_count(call: _Builder, ones: Node, rows: int, what: str) -> None:
    count = call(aten.sum.default, ones)
    message = (f"{what} at {portable_source_line(call.anchor)}: its boolean mask must select {rows} rows, as "
               "when the program was exported (the program's shapes fix the number); this input's mask selects "
               "another number")
    call(aten._assert_async.msg, call(aten.eq.Scalar, count, rows), message)


def _static_rows(val) -> int | None:
    """The row count where it is a number (a SymInt that the program's asserts fixed counts), else None."""
    if not isinstance(val, torch.Tensor) or not val.dim() or not is_concrete_int(val.shape[0]):
        return None
    return int(val.shape[0])


def _gather(graph: torch.fx.Graph, node: Node) -> bool:
    """x[mask] with a static row count N -> x's entries at ranks 1..N."""
    mask, source = mask_of(node.args[1]), node.args[0]
    rows = _static_rows(node_value(node))
    if mask is None or rows is None or not isinstance(node_value(source), torch.Tensor):
        return False
    call = _Builder(graph, node)
    flat, ones, rank = _entries(call, mask)
    wanted = call(aten.unsqueeze.default, call(aten.arange.start, 1, rows + 1, dtype=torch.int64), 1)  # [N, 1]
    hits = call(aten.logical_and.default, call(aten.eq.Tensor, call(aten.unsqueeze.default, rank, 0), wanted),
                call(aten.unsqueeze.default, flat, 0))  # [N, entries]: entry e is the k-th True
    positions = call(aten.argmax.default, call(aten._to_copy.default, hits, dtype=torch.int32), 1)
    entries = call(aten.reshape.default, source, [-1, *node_value(source).shape[node_value(mask).dim():]])
    selected = call(aten.index_select.default, entries, 0, positions)
    selected.meta["val"] = node.meta["val"]
    _check_count(call, ones, rows, "x[mask]")
    node.replace_all_uses_with(selected)  # the program's asserts on the count now read a static size: folded
    graph.erase_node(node)
    return True


def _put(graph: torch.fx.Graph, node: Node) -> bool:
    """base[mask] = values (N rows, or broadcast) -> where(mask, values[rank - 1], base)."""
    base, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    mask = mask_of(indices)
    base_val, values_val = node_value(base), node_value(values)
    if accumulate or mask is None or not isinstance(base_val, torch.Tensor) or not isinstance(values_val, torch.Tensor):
        return False
    leading = node_value(mask).dim()
    row_shape = base_val.shape[leading:]
    one_row = values_val.dim() <= len(row_shape) or statically_known_true(values_val.shape[0] == 1)
    rows = _static_rows(values_val)
    if values_val.dtype != base_val.dtype or (not one_row and rows is None):
        return False
    call = _Builder(graph, node)
    if one_row:  # PyTorch broadcasts it over every selected row
        written = call(aten.reshape.default, values, list(values_val.shape[1:])) \
            if values_val.dim() > len(row_shape) else values
    else:
        _, ones, rank = _entries(call, mask)
        # entry e takes value row (Trues before e): rank - 1 on the Trues; mod N keeps any mask in bounds
        before = call(aten.sub.Tensor, rank, ones)
        index = call(aten.remainder.Scalar, before, rows)
        per_entry = call(aten.index_select.default, values, 0, index)  # [entries, *row_shape]
        shape = [call(aten.sym_size.int, mask, d) for d in range(leading)] + list(row_shape)
        written = call(aten.reshape.default, per_entry, shape)
        _check_count(call, ones, rows, "x[mask] = values")
    replace_put(graph, node, mask, written)
    return True


def count_rows(program: ExportedProgram) -> int:
    """Rewrites each masked read or write of a static row count left in the (functional) program; returns how
    many."""
    graph = program.graph
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.index.Tensor:
            done += _gather(graph, node)
        elif node.target is aten.index_put.default:
            done += _put(graph, node)
    if done:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
        logger.info("%d masked row read(s)/write(s) of a fixed row count made static (checked at run time)", done)
    return done
