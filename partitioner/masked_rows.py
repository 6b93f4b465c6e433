"""Row computations under a boolean mask, made dense: experts routed by an input (token-type MoE).

Mixture-of-transformers policies (WALL-OSS's `SparseMoeBlock` in lerobot's
wall_x/qwen_model/qwen2_5_vl_moe.py) route tokens to experts by a token-type
input or a comparison, not by a top-k, and write each expert as

    mask = experts_indices == expert_idx                 # [batch, seq] bool
    processed = expert(hidden_states[mask][:, :dim])     # the selected rows
    b, s = torch.where(mask)
    output[b, s, :dim] = processed                       # back under the same mask

(as torch.export records it: index.Tensor(x, [mask]) -> row-wise ops ->
index_put(base, where(mask), rows)). The row count is data-dependent, which
TensorRT cannot take. Here each such computation becomes dense: the same ops on
every row of x, then where(mask, that, base), with the token count as dynamic as
the model's. Rows outside the mask are computed and dropped.

Why dense and not a counting sort + GroupedMM, as top-k routing is lowered:
- exact for any experts: WALL-OSS's experts differ in width (`dim_inputs`,
  per-expert intermediate sizes), so their weights do not stack into one
  GroupedMM; dense needs no stacking, no sort, no gather and no scatter;
- token-type routing has few experts (one per modality: WALL-OSS has 2), so
  the cost is bounded by E x the experts' multiply-adds, in plain GEMMs
  TensorRT fuses with their activations. Measured
  (benchmarks/token_type_moe_bench.py, eager PyTorch on this project's CPU,
  one thread; hidden 512, experts of FFN 1408 and 704 (half width), a quarter
  of the tokens of type 1): the dense form takes 1.54x, 1.61x, 1.67x the
  masked form's time at 64, 256, 1024 tokens, its multiply-add ratio (1.54x):
  it pays for its extra multiply-adds and nothing else. The masked form needs
  a host sync per expert for its row count, which an engine cannot do at all.
  Not measured on a GPU (the script takes --device cuda).
Only ops that act on each row alone are copied (linear, pointwise ops,
slices, reductions and softmax off the row axis, casts); anything else keeps
the computation as written (logged), which then stays with ExecuTorch.
"""

from __future__ import annotations

import logging
import operator

import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from et_trt_backend.op_support import node_value
from et_trt_backend.source_lines import source_line

logger = logging.getLogger(__name__)

aten = torch.ops.aten

# Ops that turn a mask into the coordinates of its True entries (torch.where(mask), mask.nonzero(as_tuple=True)).
_COORDINATES = frozenset({aten.where.default, aten.nonzero_numpy.default})
# Row-wise ops that take an axis (argument position): the axis must not be the row axis.
_AXIS_ARGUMENT = {
    aten.slice.Tensor: 1,
    aten.mean.dim: 1,
    aten.sum.dim_IntList: 1,
    aten.amax.default: 1,
    aten._softmax.default: 1,
    aten.softmax.int: 1,
}
_LAYOUT_FREE = frozenset({aten.alias.default, aten.clone.default, aten._to_copy.default})


def mask_of(indices: object) -> Node | None:
    """The boolean mask an index list stands for: [mask], or [c0, c1, ...] with ci = where(mask)[i]."""
    if not isinstance(indices, (list, tuple)) or not indices or not all(isinstance(i, Node) for i in indices):
        return None
    if len(indices) == 1 and getattr(node_value(indices[0]), "dtype", None) == torch.bool:
        return indices[0]
    sources = {i.args[0] for i in indices if i.target is operator.getitem}
    if len(sources) != 1 or [i.args[1] for i in indices if i.target is operator.getitem] != list(range(len(indices))):
        return None
    (coordinates,) = sources
    if coordinates.target not in _COORDINATES or len(coordinates.args) != 1:
        return None
    mask = coordinates.args[0]
    val = node_value(mask)
    return mask if val is not None and val.dtype == torch.bool and val.dim() == len(indices) else None


def _axis_args(node: Node, rank: int) -> tuple | None:
    """`node`'s args with its axis counted from the end (valid for rows and for the dense tensor), or None
    where the axis is the row axis (or all axes)."""
    position = _AXIS_ARGUMENT[node.target]
    args = list(node.args) + [0] * (position + 1 - len(node.args))  # slice's dim defaults to 0
    axes = args[position]
    many = isinstance(axes, (list, tuple))
    if axes is None or (many and not axes):
        return None
    normalized = [a % rank for a in (axes if many else [axes])]
    if 0 in normalized:
        return None
    negative = [a - rank for a in normalized]
    args[position] = negative if many else negative[0]
    return tuple(args)


def _row_free(value: object, rows_rank: int) -> bool:
    """A value from outside the rows broadcasts against them without a row axis of its own."""
    val = node_value(value)
    if not isinstance(val, torch.Tensor):
        return not isinstance(value, Node) or not free_unbacked_symbols(val)
    if free_unbacked_symbols(val):
        return False
    return val.dim() < rows_rank or statically_known_true(val.shape[0] == 1)


def _why_not_row_wise(node: Node, rows: set[Node]) -> str | None:
    """None where `node` (in `rows`) computes each row from that row alone; else why not."""
    val = node_value(node)
    inputs = [a for a in node.all_input_nodes if a in rows]
    rank = node_value(inputs[0]).dim() if inputs and isinstance(node_value(inputs[0]), torch.Tensor) else 0
    flat = [x for a in (*node.args, *node.kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else [a])]
    flat = [x for x in flat if not (isinstance(x, Node) and x in rows)]
    if not isinstance(val, torch.Tensor) or rank == 0:
        return "it computes a size or a non-tensor from the rows"
    if node.target in (aten.linear.default, aten.matmul.default):
        weight, *bias = node.args[1:]
        fixed = [a for a in (weight, *bias) if isinstance(a, Node)]
        if (node.args[0] not in rows or any(a in rows or free_unbacked_symbols(node_value(a)) for a in fixed)
                or node_value(weight).dim() != 2):
            return "its weight is not a matrix independent of the rows"
        return None
    if node.target in _AXIS_ARGUMENT:
        if _axis_args(node, rank) is None:
            return "it works along the row axis"
        return None if all(_row_free(a, rank) for a in flat) else "it mixes rows with a tensor of rows"
    if node.target in _LAYOUT_FREE or torch.Tag.pointwise in getattr(node.target, "tags", ()):
        return None if all(_row_free(a, rank) for a in flat) else "it mixes rows with a tensor of rows"
    return "it is not one of the row-wise ops (linear, pointwise, slices, reductions and softmax off the row axis)"


def _between(start: Node, end: Node) -> set[Node]:
    """Nodes on a path from `start` to `end`, both included (empty if `end` is not reached)."""
    after, frontier = set(), [start]
    while frontier:
        node = frontier.pop()
        if node not in after:
            after.add(node)
            frontier.extend(node.users)
    if end not in after:
        return set()
    on_path, frontier = set(), [end]
    while frontier:
        node = frontier.pop()
        if node in after and node not in on_path:
            on_path.add(node)
            frontier.extend(node.all_input_nodes)
    return on_path


def _selection(values: Node, mask: Node) -> Node | None:
    """The index.Tensor(x, mask) whose rows `values` is computed from (the one such selection)."""
    found, seen, frontier = [], set(), [values]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.target is aten.index.Tensor and mask_of(node.args[1]) is mask:
            found.append(node)
            continue
        frontier.extend(node.all_input_nodes)
    return found[0] if len(found) == 1 else None


def _densify(graph: torch.fx.Graph, put: Node) -> bool:
    """Replaces index_put(base, mask, f(x[mask])) by where(mask, f(x), base); False where it is another form."""
    base, indices, values = put.args[:3]
    accumulate = put.args[3] if len(put.args) > 3 else put.kwargs.get("accumulate", False)
    mask = mask_of(indices)
    if accumulate or mask is None or not isinstance(values, Node):
        return False
    selection = _selection(values, mask)
    if selection is None:
        return False
    source, base_val, mask_val, values_val = selection.args[0], node_value(base), node_value(mask), node_value(values)
    leading = mask_val.dim()
    shapes_fit = (base_val.dim() == leading + values_val.dim() - 1
                  and all(statically_known_true(a == b) for a, b in zip(base_val.shape, mask_val.shape))
                  and all(statically_known_true(a == b) for a, b in zip(base_val.shape[leading:], values_val.shape[1:]))
                  and base_val.dtype == values_val.dtype)
    if not shapes_fit:
        return False
    rows = _between(selection, values)
    for node in sorted(rows - {selection}, key=list(graph.nodes).index):
        why = _why_not_row_wise(node, rows)
        if why is not None:
            logger.info("masked rows kept as written (they stay with ExecuTorch): %s at %s: %s", node.target,
                        source_line(node), why)
            return False

    env = {selection: source}
    remap = lambda n: env.get(n, n)  # noqa: E731
    with graph.inserting_before(put):
        for node in [n for n in graph.nodes if n in rows and n is not selection]:
            dense = graph.node_copy(node, remap)
            if node.target in _AXIS_ARGUMENT:
                dense.args = torch.fx.node.map_arg(_axis_args(node, node_value(node.all_input_nodes[0]).dim()), remap)
            for key in ("val", "tensor_meta"):  # shapes change: the re-trace fills them in
                dense.meta.pop(key, None)
            env[node] = dense
    replace_put(graph, put, mask, env[values])
    for rows_of in (selection, *indices):
        _drop_row_count_checks(graph, rows_of)
    return True


def replace_put(graph: torch.fx.Graph, put: Node, mask: Node, written: Node) -> None:
    """Replaces `put`, an index_put(base, <mask>, ...), by where(mask, written, base), the mask broadcast over
    base's row dimensions. The result carries the put's module and source line, and its value (base's shape and
    dtype: a later put on this result, the next expert writing all features, reads them)."""
    base = put.args[0]
    origin = {k: put.meta[k] for k in ("nn_module_stack", "stack_trace") if k in put.meta}
    keep = mask
    with graph.inserting_before(put):
        for _ in range(node_value(base).dim() - node_value(mask).dim()):
            keep = graph.call_function(aten.unsqueeze.default, (keep, -1))
            keep.meta.update(origin)
        selected = graph.call_function(aten.where.self, (keep, written, base))
    selected.meta.update(origin)
    selected.meta["val"] = put.meta["val"]
    put.replace_all_uses_with(selected)
    graph.erase_node(put)


def _drop_row_count_checks(graph: torch.fx.Graph, rows_of: Node) -> None:
    """Removes the runtime checks torch.export put on the row count of `rows_of` (the selection, the mask's
    coordinates: 0 <= rows <= max): with the rows gone they check nothing, and they would keep the
    data-dependent ops alive."""
    for size in [u for u in rows_of.users if u.target is aten.sym_size.int and free_unbacked_symbols(node_value(u))]:
        checks = set()
        frontier = [size]
        while frontier:
            node = frontier.pop()
            if node not in checks:
                checks.add(node)
                frontier.extend(node.users)
        if all(n.target is aten._assert_scalar.default or not isinstance(node_value(n), torch.Tensor) for n in checks):
            for node in sorted(checks, key=list(graph.nodes).index, reverse=True):
                graph.erase_node(node)


def has_masked_rows(program: ExportedProgram) -> bool:
    """Whether the program reads or writes rows under a boolean mask (what `densify` and counted_rows look for)."""
    return any(node.target in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default)
               and mask_of(node.args[1]) is not None
               for node in program.graph.nodes if node.op == "call_function")


def densify(program: ExportedProgram) -> int:
    """Makes each masked row computation of the (functional) program dense; returns how many."""
    graph = program.graph
    done = sum(_densify(graph, node) for node in list(graph.nodes)
               if node.op == "call_function" and node.target is aten.index_put.default)
    if done:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
        logger.info("%d masked row computation(s) made dense (experts routed by a mask)", done)
    return done
