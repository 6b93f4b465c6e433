"""ATen rewrites applied before ExecuTorch's edge decompositions (transform_for_pre_decomposition).

Each rewrite keeps the program's meaning and exists because the edge pipeline
would otherwise break the program for TensorRT:

- split / chunk -> slices. ExecuTorch 1.5's edge dtype validator takes the
  first tensor of a split's output list for the list itself and calls len()
  on it; when that tensor's first dimension is dynamic (tokens x features,
  split along features, as every fused gate/up projection does) the call
  guards the symbol to its example value and the exported dynamic token count
  silently becomes static. Slices return single tensors and avoid that.
- one_hot -> (ids[..., None] == arange(num_classes)). one_hot's decomposition
  carries an _assert_async on the index range, a data check TensorRT cannot
  express; the comparison gives the same counts for valid ids.
- bincount(expert ids, minlength=E) -> one-hot counts. bincount's size
  depends on the data and ExecuTorch cannot preserve it (no fake kernel for
  its do-not-decompose wrapper); when the ids are the router's top-k / max /
  argmax indices over E <= minlength experts, the counts have exactly
  minlength entries, which the comparison form gives with a static size.
- empty_like -> zeros_like, new_empty -> new_zeros. empty_like decomposes to
  empty_permuted, which is not core ATen, and has no portable kernel if
  preserved; new_empty becomes ExecuTorch's _empty_dim_order, which has no
  TensorRT form. Their values are undefined, so zeros are one valid choice
  (model code overwrites them whole: an inverse permutation, a key assembled
  slice by slice), and a deterministic one.
- complex tensors -> real pairs (complex_pairs.py): TensorRT has no complex
  type and ExecuTorch's to_edge refuses polar and complex views (DeepSeek-V2's
  rotary embedding); the real-pair arithmetic is exact.
- float64 program inputs and outputs -> a float32 round trip (truncate_double):
  TensorRT binds no float64, so the cast to and from float64 at the edge of a
  partition stays on ExecuTorch (_float64_boundary_casts).
- eye -> (arange(n)[:, None] == arange(m)) in int64. PyTorch's own
  decomposition counts in uint8 where n and m fit (Qwen3-Next's chunked delta
  rule builds torch.eye(chunk)), a dtype TensorRT tensors do not have, which
  would leave the identity to ExecuTorch.
- adaptive_max_pool2d -> max_pool2d_with_indices where the input is a whole
  number of windows. It is not core ATen, has no decomposition and returns
  two tensors: ExecuTorch's edge verifier would refuse it.
- sort(stable=True) -> argsort(stable=True) + gather. sort.stable is not core
  ATen and, having two outputs, cannot be preserved through to_edge;
  argsort.stable has one output and is preserved (op_support.PRESERVED_OPS).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import TensorArgument
from torch.utils import _pytree as pytree

from et_trt_backend.op_support import holds_float64, unsupported_reason
from et_trt_backend.op_support.routing import integer_key_bound
from et_trt_backend.source_lines import source_line

from . import counted_rows, masked_rows
from .complex_pairs import complex_to_real_pairs, has_complex
from .errors import PartitionError

aten = torch.ops.aten


def _split_sizes_to_slices(x: torch.Tensor, split_sizes: list[int], dim: int = 0) -> list[torch.Tensor]:
    pieces, start = [], 0
    for size in split_sizes:
        pieces.append(aten.slice.Tensor(x, dim, start, start + size))
        start = start + size
    return pieces


def _split_to_slices(x: torch.Tensor, split_size: int, dim: int = 0) -> list[torch.Tensor]:
    total = x.shape[dim]
    sizes = [min(split_size, total - start) for start in range(0, total, split_size)] or [0]
    return _split_sizes_to_slices(x, sizes, dim)


def _stable_sort(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1, descending: bool = False):
    indices = aten.argsort.stable(x, stable=bool(stable), dim=dim, descending=descending)
    return aten.gather.default(x, dim, indices), indices


def _one_hot(ids: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    if num_classes < 0:
        raise ValueError("one_hot needs num_classes: without it the width depends on the data")
    classes = aten.arange.start(0, num_classes, dtype=ids.dtype, device=ids.device)
    return aten._to_copy.default(aten.eq.Tensor(aten.unsqueeze.default(ids, -1), classes), dtype=torch.int64)


def _eye(n: int, m: int | None = None, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    rows = aten.arange.start(0, n, dtype=torch.int64, device=device)
    columns = aten.arange.start(0, n if m is None else m, dtype=torch.int64, device=device)
    identity = aten.eq.Tensor(aten.unsqueeze.default(rows, -1), columns)
    return aten._to_copy.default(identity, dtype=dtype or torch.get_default_dtype())


def _empty_like(x: torch.Tensor, **kwargs) -> torch.Tensor:
    return aten.zeros_like.default(x, **kwargs)


def _new_empty(x: torch.Tensor, size, **kwargs) -> torch.Tensor:
    return aten.new_zeros.default(x, size, **kwargs)


def _adaptive_max_pool2d(x: torch.Tensor, output_size):
    """Windows of one static size (the input divisible by the output): the same values and indices as
    max_pool2d_with_indices with that kernel and stride. Other sizes fall through (NotImplemented)."""
    sizes = [*x.shape[-2:], *output_size]
    if not all(isinstance(s, int) for s in sizes) or sizes[0] % sizes[2] or sizes[1] % sizes[3]:
        return NotImplemented
    kernel = [sizes[0] // sizes[2], sizes[1] // sizes[3]]
    return aten.max_pool2d_with_indices.default(x, kernel, kernel)


PRE_DECOMPOSITIONS = {
    aten.eye.default: _eye,
    aten.eye.m: _eye,
    aten.adaptive_max_pool2d.default: _adaptive_max_pool2d,
    aten.empty_like.default: _empty_like,
    aten.new_empty.default: _new_empty,
    aten.one_hot.default: _one_hot,
    aten.split.Tensor: _split_to_slices,
    aten.split_with_sizes.default: _split_sizes_to_slices,
    aten.sort.stable: _stable_sort,
}


def _countable_bincounts(program: ExportedProgram) -> list[torch.fx.Node]:
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not aten.bincount.default:
            continue
        weights = node.args[1] if len(node.args) > 1 else node.kwargs.get("weights")
        minlength = node.args[2] if len(node.args) > 2 else node.kwargs.get("minlength", 0)
        bins = integer_key_bound(node.args[0])
        if weights is None and bins is not None and isinstance(minlength, int) and bins <= minlength:
            found.append(node)
    return found


def _bincounts_to_one_hot(program: ExportedProgram, bincounts: list[torch.fx.Node]) -> None:
    graph = program.graph
    for node in bincounts:
        ids = node.args[0]
        minlength = node.args[2] if len(node.args) > 2 else node.kwargs["minlength"]
        with graph.inserting_before(node):
            classes = graph.call_function(aten.arange.start, (0, minlength), {"dtype": ids.meta["val"].dtype})
            column = graph.call_function(aten.unsqueeze.default, (ids, -1))
            hits = graph.call_function(aten.eq.Tensor, (column, classes))
            ones = graph.call_function(aten._to_copy.default, (hits,), {"dtype": torch.int64})
            counts = graph.call_function(aten.sum.dim_IntList, (ones, [0]))
        for new in (classes, column, hits, ones, counts):  # same module and source line as the bincount
            new.meta.update({k: node.meta[k] for k in ("nn_module_stack", "stack_trace") if k in node.meta})
        node.replace_all_uses_with(counts)
        graph.erase_node(node)
    program.graph_module.recompile()


def _refuse_other_bincounts(program: ExportedProgram) -> None:
    # Left alone, bincount fails ExecuTorch's verifier with a message that names no source line.
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is aten.bincount.default:
            raise PartitionError(f"aten.bincount.default at {source_line(node)}: {unsupported_reason(node)}")


def _float64_boundaries(program: ExportedProgram) -> bool:
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    return any(map(holds_float64, inputs + pytree.tree_leaves(program.graph.output_node().args)))


def _float64_boundary_casts(program: ExportedProgram) -> None:
    """Each float64 program input x becomes x.to(float32).to(float64), each float64 output y
    y.to(float32).to(float64): the outer cast stays on ExecuTorch, the inner one joins the partition
    (TensorRTPartitioner's _keep_float64_inside says why), which computes float64 in float32 anyway. Every
    user of such an input, delegated or not, then reads it rounded to float32."""
    graph = program.graph
    user_inputs = set(program.graph_signature.user_inputs)
    first_op = next(n for n in graph.nodes if n.op != "placeholder")

    def round_trip(value: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
        narrow = graph.call_function(aten._to_copy.default, (value,), {"dtype": torch.float32})
        return narrow, graph.call_function(aten._to_copy.default, (narrow,), {"dtype": torch.float64})

    for node in [n for n in graph.nodes if n.op == "placeholder" and n.name in user_inputs and holds_float64(n)]:
        with graph.inserting_before(first_op):
            narrow, wide = round_trip(node)
        node.replace_all_uses_with(wide, delete_user_cb=lambda user: user is not narrow)
    output = graph.output_node()
    values, spec = pytree.tree_flatten(output.args)
    for i, value in enumerate(values):
        if holds_float64(value):
            with graph.inserting_before(output):
                values[i] = round_trip(value)[1]
            program.graph_signature.output_specs[i].arg = TensorArgument(name=values[i].name)
    output.args = pytree.tree_unflatten(values, spec)
    program.graph_module.recompile()


def rewrite_for_edge(program: ExportedProgram, truncate_double: bool = True) -> ExportedProgram:
    """`program` with the rewrites above and masked_rows' (a new program; the input is not changed); with
    truncate_double (every part of the recipe computes float64 in float32), cast pairs at its float64 inputs
    and outputs."""
    edited = False
    float64_casts = truncate_double and _float64_boundaries(program)
    complex_ops = has_complex(program)
    if float64_casts or complex_ops or _countable_bincounts(program) or masked_rows.has_masked_rows(program):
        program = program.run_decompositions({})  # a functional copy whose graph we may edit
        bincounts = _countable_bincounts(program)
        _bincounts_to_one_hot(program, bincounts)
        densified = masked_rows.densify(program) + counted_rows.count_rows(program)
        if complex_ops:
            complex_to_real_pairs(program)
        if float64_casts:
            _float64_boundary_casts(program)
        edited = bool(bincounts or densified or float64_casts or complex_ops)
    _refuse_other_bincounts(program)
    targets = set(PRE_DECOMPOSITIONS) | {aten.chunk.default}  # chunk decomposes into split
    if not edited and not any(node.op == "call_function" and node.target in targets for node in program.graph.nodes):
        return program  # the re-trace below also gives edited nodes their shapes
    return program.run_decompositions(dict(PRE_DECOMPOSITIONS))
