"""Each MoE block's dispatch -> experts -> combine becomes one fused MoEExperts op (issue 32); the router stays.

After the routing rewrites a MoE block's experts are, in whatever order and form the model writes them:

    perm = sort(ids.view(-1))[1]                      # counting_sort, any sort of the flat top-k ids
    offs = cumsum(counts of the ids)                  # histc / bincount / one_hot sums
    y = grouped_mm(x[perm // k], w_gate_up, offs)     # the gate+up GEMM on the gathered rows
    y = y + b_gate_up[sorted ids]                     # GPT-OSS's bias (optional)
    h = act(y)                                        # elementwise: SwiGLU, GELU-GLU, GPT-OSS's clamped GLU, SiLU...
    z = grouped_mm(h, w_down, offs) (+ b_down[sorted ids])
    out = combine(z * weights[perm])                  # un-permute (index_put, an inverse permutation) + sum over k

This pass finds the block from its two grouped GEMMs (they share `offs`), reads the anchors off the graph
(hidden x, the flat ids and k from the row gather, the routing weights from the one multiply between the down
GEMM and the combine, the weights and biases, the output: the first [T, H] value after the down GEMM), names
the activation by evaluating the ops between the GEMMs on probe rows against every MoEExperts activation,
and then checks the whole block: its ops, run on random tokens, ids and weights, must give what
moe_experts.reference gives with the weights the fused op will hold. Only then is the output replaced by
et_trt_lowering.moe_experts(x, ids [T, k] int32, weights [T, k], w_gate_up [E, N1, H], w_down [E, H, F],
biases), whose ONNX form is one MoEExperts node; the sort, counts, gathers, GEMMs and combine become dead code.
The check runs the block's ops in float32 (bf16/fp16 values computed from the inputs, and casts to those
types, become float32; weights and constants stay as the model holds them), on ids of a few experts whose
sort is not the identity, at two token counts where the count is dynamic.

The expert weights become new constants, laid out as the fused op takes them: [E, out, in] (transposed where
the model stores [E, in, out]) and, for gated activations with F % 8 == 0, the gate+up rows in "blocked8"
order, which the kernels read fastest (moe_experts.relayout); with expert_precision "fp8" or "int4" they are then
quantized (fp8_experts.py, int4_experts.py). A block that does not match any step keeps the GroupedMM lowering, and
its MoEBlockForm says what did not match; `et-trt inspect` prints them.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Iterable

import sympy
import torch

from et_trt_backend import moe_experts
from et_trt_backend.module_paths import common_prefix, module_path
from et_trt_backend.op_support import node_value
from et_trt_backend.op_support.routing import ROUTER_OPS, SORTS, as_floor_division
from et_trt_backend.options import CompileOptions
from et_trt_backend.plugin_names import MOE_ACTIVATIONS, MOE_EXPERTS_OP, MOE_GATED_ACTIVATIONS
from et_trt_backend.source_lines import source_line

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)
from .program_weights import ProgramWeights
from .routing_rewrites import RewriteContext
from .translations import KERNEL_DTYPES

logger = logging.getLogger(__name__)
aten = torch.ops.aten
lowering_ops = torch.ops.et_trt_lowering

FUSED = MOE_EXPERTS_OP
UNFUSED = "GroupedMM"
# Ops that move a tensor's elements without computing on them: followed from the routing-weight multiply back
# to the weights as the router made them (their row-major [T, k] order is kept).
_SHAPE_OPS = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
                        aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default,
                        aten.flatten.using_ints, aten.clone.default})
_MULTIPLIES = frozenset({aten.mul.Tensor, operator.mul})
_PROBE_ROWS = 24
_MAX_COMBINE_CANDIDATES = 3
_MAX_CHECK_EXPERTS = 6  # experts the whole-block check routes to (at least k)
_ACTIVATION_TOLERANCE = dict(rtol=1e-4, atol=1e-5)
_BLOCK_TOLERANCE = 1e-4  # of the output's largest magnitude: float32 on both sides, sums in another order


@dataclasses.dataclass(frozen=True)
class MoEBlockForm:
    """How one MoE block of a partition is lowered, and why."""

    block: str  # the module holding router and experts ("" for the exported module itself)
    form: str  # FUSED or UNFUSED
    detail: str  # fused: activation, layout and sizes; unfused: what did not match
    dtype: str = ""  # fused: the kernel dtype of the MoEExperts node, "bf16" or "fp16"

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class NoMatch(Exception):
    """The block is not the fused op's pattern; the message says what did not match."""


@dataclasses.dataclass
class _Activation:
    name: str  # a key of MOE_ACTIVATIONS
    layout: str  # the model's gate+up layout ("concat" for non-gated)
    alpha: float = moe_experts.GPTOSS_ALPHA
    limit: float = moe_experts.GPTOSS_LIMIT


@dataclasses.dataclass
class _Block:
    """A matched block's anchors in the graph and its fused operands."""

    gate_up: torch.fx.Node  # the gate+up GEMM
    gather: torch.fx.Node  # x[perm // k], the model's own node: its module path and source line are the block's
    x: torch.fx.Node  # hidden [T, H]
    ids: torch.fx.Node  # the flat top-k ids [T * k], row-major
    top_k: int
    activation: _Activation
    w_gate_up: torch.Tensor  # [E, N1, H], in the layout written
    w_down: torch.Tensor  # [E, H, F]
    b_gate_up: torch.Tensor | None
    b_down: torch.Tensor | None
    layout: str  # the layout written: the kernels' fastest where it applies
    out: torch.fx.Node | None = None  # the combined [T, H]
    weights: torch.fx.Node | None = None  # the routing weights, row-major [T, k] in any shape


def fuse_moe_blocks(program: torch.export.ExportedProgram, options: CompileOptions) -> list[MoEBlockForm]:
    """Replaces (in place) each MoE block of the ATen `program` (after routing_rewrites) that matches by one
    moe_experts op, per the options; returns every block's form, in graph order."""
    ctx = RewriteContext(program)
    weights = ProgramWeights(program)
    order = {node: i for i, node in enumerate(ctx.graph.nodes)}
    gemms: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in ctx.graph.nodes:
        if node.target is lowering_ops.grouped_mm.default:
            gemms.setdefault(node.args[2], []).append(node)
    forms = []
    for group in gemms.values():
        name = _block_name(group[0])
        try:
            _check_options(options)
            block = _checked(ctx, weights, *_match(ctx, weights, group, order))
        except NoMatch as e:
            forms.append(MoEBlockForm(name, UNFUSED, str(e)))
            logger.info("MoE block %r at %s stays %s: %s", name, source_line(group[0]), UNFUSED, e)
            continue
        detail = _replace(ctx, weights, block)
        forms.append(MoEBlockForm(name, FUSED, detail, KERNEL_DTYPES[node_value(block.x).dtype]))
        logger.info("MoE block %r at %s: one %s node (%s)", name, source_line(group[0]), FUSED, detail)
    if any(form.form == FUSED for form in forms):
        ctx.graph.eliminate_dead_code()
        for node in [n for n in ctx.graph.nodes if n.op == "placeholder"]:
            weights.drop_if_unused(node)
        program.graph_module.recompile()
    return forms


def _check_options(options: CompileOptions) -> None:
    if not options.fused_experts:
        raise NoMatch("fused_experts = false")
    if not options.grouped_gemm_kernel:
        raise NoMatch("grouped_gemm_kernel = false: the experts are lowered densely")


def _checked(ctx: RewriteContext, weights: ProgramWeights, block: _Block, combines) -> _Block:
    """The block with the first of its candidate outputs and routing weights that passes the numeric check."""
    first_error = None
    for out, routing_weights in combines:
        candidate = dataclasses.replace(block, out=out, weights=routing_weights)
        try:
            _check_numerics(ctx, weights, candidate)
            return candidate
        except NoMatch as e:
            first_error = first_error or e
    raise first_error


# ---- matching ------------------------------------------------------------------------------------------
def _match(ctx: RewriteContext, weights: ProgramWeights, group: list[torch.fx.Node], order):
    """(the block without its output and routing weights, the candidates for those: (out, weights) pairs)."""
    if len(group) != 2:
        raise NoMatch(f"{len(group)} grouped GEMMs share the offsets {group[0].args[2].name}; the fused form "
                      "takes one gate+up and one down GEMM")
    gate_up, down = sorted(group, key=order.get)
    if gate_up not in _ancestors([down.args[0]]):
        raise NoMatch(f"the second grouped GEMM ({down.name}) does not take the first's ({gate_up.name}) output")
    gather, x, ids, top_k = _dispatch(ctx, gate_up.args[0])
    dtype = node_value(x).dtype
    if dtype not in KERNEL_DTYPES:
        raise NoMatch(f"the hidden states ({x.name}) are {dtype}; MoEExperts computes in bf16 or fp16")
    w_gate_up, b_gate_up, activated = _gemm_with_bias(weights, gate_up, "gate+up")
    w_down, b_down, combined = _gemm_with_bias(weights, down, "down")
    for name, tensor in (("gate+up", w_gate_up), ("down", w_down)):
        if tensor.dtype != dtype:
            raise NoMatch(f"the {name} weights are {tensor.dtype} but the hidden states {dtype}")
    activation = _identify_activation(ctx, weights, activated, down.args[0], w_gate_up.shape[1])
    combines = _combines(x, combined, gate_up, order)
    layout = activation.layout
    if activation.name in MOE_GATED_ACTIVATIONS and w_gate_up.shape[1] % 16 == 0:
        layout = "blocked8"  # the kernels' fastest (plugin_names.MOE_GATE_UP_LAYOUTS)
        w_gate_up, b_gate_up = moe_experts.relayout(w_gate_up, b_gate_up, activation.layout, layout)
    if b_gate_up is None and b_down is not None:  # the op takes b_down only after a b_gate_up
        b_gate_up = w_gate_up.new_zeros(w_gate_up.shape[:2])
    block = _Block(gate_up, gather, x, ids, top_k, activation, w_gate_up.contiguous(), w_down.contiguous(), b_gate_up,
                   b_down, layout)
    return block, combines


def _dispatch(ctx: RewriteContext, rows: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, int]:
    """(the gather, x, flat ids, k) where the gate+up GEMM's rows are x[perm // k], perm a sort of the flat ids."""
    gather = rows
    while gather.target is aten._to_copy.default:
        gather = gather.args[0]
    if gather.target is not aten.index.Tensor or len(gather.args[1]) != 1 or node_value(gather.args[0]).dim() != 2:
        raise NoMatch(f"the gate+up GEMM's rows ({gather.name}, {_op_name(gather)}) are not the hidden states "
                      "gathered by the sort of the expert ids, x[perm // k]")
    x, (index,) = gather.args
    found = as_floor_division(index)
    perm, top_k = found if found is not None else (index, 1)
    top_k = ctx.constant(top_k)
    if isinstance(top_k, torch.Tensor) and top_k.numel() == 1 and not top_k.is_floating_point():
        top_k = int(top_k.item())
    if not isinstance(top_k, int) or top_k < 1:
        raise NoMatch(f"the row gather's index ({index.name}) divides the sort's permutation by a value that is not "
                      "a constant k")
    sort = perm.args[0] if perm.target is operator.getitem and perm.args[1] == 1 else perm
    if sort.target not in SORTS | {lowering_ops.counting_sort.default}:
        raise NoMatch(f"the row gather's permutation ({perm.name}, {_op_name(perm)}) is not a sort of the expert ids")
    ids = sort.args[0]
    if node_value(ids).dim() != 1:
        raise NoMatch(f"the sorted expert ids ({ids.name}) are not flat [T * k]")
    if node_value(rows).dtype != node_value(x).dtype:
        raise NoMatch(f"the gathered rows ({rows.name}) are cast from the hidden states' {node_value(x).dtype}")
    return gather, x, ids, top_k


def _gemm_with_bias(weights: ProgramWeights, gemm: torch.fx.Node, what: str):
    """(weights [E, out, in], bias [E, out] or None, the GEMM's output after its bias) of a grouped GEMM whose
    weights are constants and whose single use, if any add, adds a constant bias gathered per row."""
    found = weights.weight(gemm.args[1])
    if found is None:
        raise NoMatch(f"the {what} weights ({gemm.args[1].name}) are computed at run time, not constants the "
                      "export can lay out for the fused op")
    value = found[1].detach()
    if not gemm.args[3]:  # stored [E, in, out]
        value = value.transpose(1, 2)
    (user,) = gemm.users if len(gemm.users) == 1 else (None,)
    if user is None or user.target is not aten.add.Tensor or len(user.args) != 2:
        return value, None, gemm
    other = user.args[1] if user.args[0] is gemm else user.args[0]
    if not (isinstance(other, torch.fx.Node) and other.target is aten.index.Tensor):
        return value, None, gemm
    bias = weights.weight(other.args[0])
    if bias is None or tuple(bias[1].shape) != tuple(value.shape[:2]) or bias[1].dtype != value.dtype:
        raise NoMatch(f"the {what} GEMM's output gets {other.name} added, which is not a constant bias "
                      f"[E, {value.shape[1]}] gathered per row")
    return value, bias[1].detach(), user


def _combines(x: torch.fx.Node, start: torch.fx.Node, gate_up: torch.fx.Node, order) -> list:
    """Candidates (out, routing weights) for the combine after the down GEMM's output `start`: out a [T, H] value
    computed from it (the first few, in graph order: with k = 1 the permuted rows are [T, H] too), the weights
    the other factor of the one multiply on the way there, followed back through shape ops and a permutation."""
    tokens, size = node_value(x).shape
    after = _descendants(start)
    outputs = [n for n in sorted(after, key=order.get) if _is_tensor(n) and node_value(n).dim() == 2
               and _same_size(node_value(n).shape[0], tokens) and node_value(n).shape[1] == size]
    if not outputs:
        raise NoMatch(f"no [T, {size}] value follows the down GEMM: the pairs are not combined per token")
    computed = _descendants(gate_up)
    found, first_error = [], None
    for out in outputs[:_MAX_COMBINE_CANDIDATES]:
        path = (_ancestors([out]) | {out}) & (after | {start})
        factors = [arg for node in path if node.target in _MULTIPLIES for arg in node.args
                   if isinstance(arg, torch.fx.Node) and arg not in path and _is_tensor(arg)]
        if len(factors) != 1:
            first_error = first_error or NoMatch(
                f"{len(factors)} multiplies by a tensor between the down GEMM and the combine ({out.name}); the fused "
                "form takes one, by the routing weights")
            continue
        factor, permuted = factors[0], False
        while factor.target in _SHAPE_OPS or (factor.target is aten.index.Tensor and not permuted):
            permuted |= factor.target is aten.index.Tensor
            factor = factor.args[0]
        if factor in computed or not node_value(factor).is_floating_point():
            first_error = first_error or NoMatch(
                f"the down GEMM's rows are multiplied by {factor.name}, which is not routing weights")
            continue
        found.append((out, factor))
    if not found:
        raise first_error
    return found


def _identify_activation(ctx: RewriteContext, weights: ProgramWeights, start: torch.fx.Node, end: torch.fx.Node,
                         width: int) -> _Activation:
    """The MoEExperts activation the ops from the gate+up output `start` to the down GEMM's input `end` compute:
    they run on probe rows, and their result is compared with each activation's (and layout's) in float32."""
    if end is start:
        raise NoMatch("the down GEMM takes the gate+up output itself: no activation between them")
    region = _in_graph_order(ctx, _descendants(start) & (_ancestors([end]) | {end}))
    evaluator = _Evaluator(ctx, weights, sizes={})
    evaluator.read_outside(region, {start}, f"the activation before the down GEMM ({end.name}) also reads")
    probe = torch.randn(_PROBE_ROWS, width, generator=torch.Generator().manual_seed(0)) * 4
    got = evaluator.run(region, {start: probe})[end]
    if got.dim() != 2 or got.shape[0] != _PROBE_ROWS:
        raise NoMatch(f"the ops between the GEMMs ({end.name}) do not keep the rows")
    for candidate in _candidates(width, got.shape[1], evaluator.scalars):
        want = moe_experts.activate(probe, candidate.name, candidate.layout, candidate.alpha, candidate.limit)
        if torch.allclose(got.float(), want, **_ACTIVATION_TOLERANCE):
            return candidate
    ops = sorted({_op_name(n) for n in region})
    raise NoMatch(f"the ops between the GEMMs ({', '.join(ops)}) compute none of the MoEExperts activations "
                  f"({', '.join(MOE_ACTIVATIONS)}) on [{width}] rows")


def _candidates(width: int, out_width: int, scalars: Iterable[float]) -> list[_Activation]:
    """The activations (and gate+up layouts) that map `width` columns to `out_width`; GPT-OSS's with its alpha
    and limit among the constants the ops read."""
    if out_width == width:
        return [_Activation(name, "concat") for name in ("silu", "gelu_erf", "gelu_tanh", "relu2")]
    if 2 * out_width != width:
        return []
    values = sorted({float(v) for v in scalars if v > 0} | {moe_experts.GPTOSS_ALPHA, moe_experts.GPTOSS_LIMIT})
    found = []
    for layout in ("concat", "interleaved"):
        found += [_Activation(name, layout) for name in ("swiglu", "geglu_erf", "geglu_tanh")]
        found += [_Activation("gptoss_glu", layout, alpha, limit) for alpha in values for limit in values]
    return found


# ---- the whole-block check --------------------------------------------------------------------------------
class _Evaluator:
    """Runs nodes of the program on concrete values: the float32 twin of what they compute.

    Values computed from the inputs given to `run` are float32 where the program has bf16/fp16 (casts to those
    types cast to float32); constants (weights, lifted constants and ops on them alone) are evaluated as
    written, as the ONNX exporter folds them; sizes (SymInt values) are their expressions at `sizes`."""

    _LOW = (torch.bfloat16, torch.float16)

    def __init__(self, ctx: RewriteContext, weights: ProgramWeights, sizes: dict[sympy.Symbol, int]):
        self.ctx, self.weights, self.sizes = ctx, weights, sizes
        self.values: dict[torch.fx.Node, object] = {}  # constants and sizes read from outside a region
        self.scalars: list[float] = []  # float constants seen: candidates for an activation's parameters

    def size(self, value) -> int:
        if isinstance(value, int):
            return value
        expr = value.node.expr
        unknown = expr.free_symbols - set(self.sizes)
        if unknown:
            raise NoMatch(f"the block reads a size ({expr}) other than its token count")
        return int(expr.subs(self.sizes))

    def read_outside(self, region: list[torch.fx.Node], inputs: set[torch.fx.Node], what: str) -> None:
        """Evaluates what `region` reads besides `inputs` and itself; NoMatch unless constants and sizes."""
        inside = set(region) | inputs
        for node in region:
            for arg in node.all_input_nodes:
                if arg not in inside:
                    self._constant_or_size(arg, f"{what} {arg.name} ({_op_name(arg)}), neither a constant nor a size")

    def _constant_or_size(self, node: torch.fx.Node, why: str) -> None:
        if node in self.values:
            return
        value = node.meta.get("val")
        if isinstance(value, (int, torch.SymInt)):
            self.values[node] = self.size(value)
            return
        found = self.weights.weight(node)
        if found is not None:
            self.values[node] = found[1].detach()
        elif node.op == "call_function":  # ops on constants and sizes, or on literals alone (arange(E))
            for arg in node.all_input_nodes:
                self._constant_or_size(arg, why)
            args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), self._constant_value)
            self.values[node] = node.target(*args, **kwargs)
        else:
            raise NoMatch(why)
        value = self.values[node]
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
            self.scalars.append(float(value))

    def _constant_value(self, arg):
        return self.values[arg] if isinstance(arg, torch.fx.Node) else arg

    def run(self, nodes: list[torch.fx.Node], inputs: dict[torch.fx.Node, torch.Tensor]) -> dict:
        """The value of every node of `nodes` (in graph order) from `inputs` and what read_outside evaluated."""
        env = {**self.values, **inputs}

        def twin(arg):
            if isinstance(arg, torch.fx.Node):
                return env[arg]
            if isinstance(arg, float):
                self.scalars.append(arg)
            return torch.float32 if arg in self._LOW else arg

        for node in nodes:
            args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), twin)
            try:
                env[node] = node.target(*args, **kwargs)
            except Exception as e:  # noqa: BLE001  (any op may refuse the probe; the block then stays unfused)
                raise NoMatch(f"{node.name} ({_op_name(node)}) cannot be evaluated on probe values: {e}") from None
        return env


def _check_numerics(ctx: RewriteContext, weights: ProgramWeights, block: _Block) -> None:
    """NoMatch unless the block's ops, from the hidden states, ids and routing weights to its output, compute
    moe_experts.reference with the fused operands, at one or two token counts (float32 on both sides)."""
    inputs = {block.x, block.ids, block.weights}
    before = _ancestors(inputs) | inputs
    region = _in_graph_order(ctx, (_ancestors([block.out]) | {block.out}) & _descendants(*inputs) - before)
    tokens = node_value(block.x).shape[0]
    for sizes in _token_counts(ctx, tokens):
        evaluator = _Evaluator(ctx, weights, sizes)
        evaluator.read_outside(region, inputs, "the block's combine also reads")
        count = evaluator.size(tokens)
        values, reference_args = _random_inputs(evaluator, block, count)
        got = evaluator.run(region, values)[block.out].float()
        want = moe_experts.compute(*reference_args, activation=block.activation.name, gate_up_layout=block.layout,
                                   alpha=block.activation.alpha, limit=block.activation.limit)
        scale = want.abs().max().item()
        error = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
        if not error <= _BLOCK_TOLERANCE * max(scale, 1e-6):
            raise NoMatch(f"the ops from the hidden states to {block.out.name} ({_op_name(block.out)}) are not "
                          f"MoEExperts({block.activation.name}): at {count} tokens their result is "
                          f"{error:.3g} off the fused op's (whose largest value is {scale:.3g})")


def _token_counts(ctx: RewriteContext, tokens) -> list[dict[sympy.Symbol, int]]:
    """Values of the token count's symbol to check the block at: two in its range (one for a static count)."""
    if isinstance(tokens, int):
        return [{}]
    symbols = tokens.node.expr.free_symbols
    if len(symbols) != 1:
        raise NoMatch(f"the token count ({tokens}) is not one dynamic size")
    (symbol,) = symbols
    bounds = ctx.program.range_constraints.get(symbol)
    low = int(bounds.lower) if bounds is not None and bounds.lower.is_finite else 1
    high = int(bounds.upper) if bounds is not None and bounds.upper.is_finite else 1 << 20
    return [{symbol: value} for value in sorted({min(max(low, n), high) for n in (3, 7)})]


def _random_inputs(evaluator: _Evaluator, block: _Block, tokens: int):
    """({x, ids, weights} for the block's ops, the reference's arguments): random float32 tokens, ids routed to a
    few experts spread over [0, E) (distinct within a token, sorted by no identity), random weights rounded
    to the model's type."""
    generator = torch.Generator().manual_seed(tokens)
    k, experts, size = block.top_k, block.w_down.shape[0], block.w_down.shape[1]
    used = torch.linspace(0, experts - 1, min(experts, max(k, _MAX_CHECK_EXPERTS))).round().long().unique()
    if len(used) < k:
        raise NoMatch(f"top-{k} of {experts} experts")
    picks = torch.stack([torch.randperm(len(used), generator=generator)[:k] for _ in range(tokens)])
    _lead_with(picks[0], len(used) - 1)  # the last expert first and the first last: the sort moves rows
    _lead_with(picks[-1], 0)
    x = torch.randn(tokens, size, generator=generator)
    ids_value = used[picks].reshape(-1).to(node_value(block.ids).dtype)
    weight_val = node_value(block.weights)
    shape = [evaluator.size(d) for d in weight_val.shape]
    routing = (torch.rand(shape, generator=generator) + 0.1).to(weight_val.dtype).float()
    values = {block.x: x, block.ids: ids_value, block.weights: routing}
    # The weights as the fused op holds them (in the model's type: compute converts one routed expert at a time)
    reference_args = (x, used[picks].int(), routing.reshape(tokens, k), block.w_gate_up, block.w_down,
                      block.b_gate_up, block.b_down)
    return values, reference_args


def _lead_with(row: torch.Tensor, value: int) -> None:
    """Puts `value` first in a row of distinct values (swapped in where the row has it), keeping them distinct."""
    where = (row == value).nonzero()
    if len(where):
        row[where[0, 0]] = row[0]
    row[0] = value


# ---- the rewrite ---------------------------------------------------------------------------------------------
def _replace(ctx: RewriteContext, weights: ProgramWeights, block: _Block) -> str:
    """block.out -> moe_experts(x, ids [T, k] int32, routing weights [T, k], the laid-out weights); a summary."""
    graph, k, dtype = ctx.graph, block.top_k, node_value(block.x).dtype
    anchor = block.gate_up.args[1]  # the new constants go beside the gate+up weights
    constants = []
    for name, value in (("w_gate_up", block.w_gate_up), ("w_down", block.w_down), ("b_gate_up", block.b_gate_up),
                        ("b_down", block.b_down)):
        node = None if value is None else weights.add_constant(anchor, f"{anchor.name}_moe_{name}", value)
        anchor = node or anchor
        constants.append(node)
    activation = block.activation
    with graph.inserting_before(block.out):
        ids = _call(ctx, block, aten.reshape.default, (block.ids, [-1, k]))
        if node_value(ids).dtype != torch.int32:
            ids = _call(ctx, block, aten._to_copy.default, (ids,), {"dtype": torch.int32})
        routing = _call(ctx, block, aten.reshape.default, (block.weights, [-1, k]))
        if node_value(routing).dtype not in (torch.float32, dtype):
            routing = _call(ctx, block, aten._to_copy.default, (routing,), {"dtype": torch.float32})
        out = _call(ctx, block, lowering_ops.moe_experts.default,
                    (block.x, ids, routing, *constants, activation.name, block.layout, activation.alpha,
                     activation.limit))
        if node_value(block.out).dtype != dtype:
            out = _call(ctx, block, aten._to_copy.default, (out,), {"dtype": node_value(block.out).dtype})
    block.out.replace_all_uses_with(out)
    experts, size, ffn = block.w_down.shape
    gptoss = f" (alpha {activation.alpha:g}, limit {activation.limit:g})" if activation.name == "gptoss_glu" else ""
    biases = ", biases" if block.b_down is not None or block.b_gate_up is not None else ""
    return (f"{activation.name}{gptoss}, {block.layout}, {experts} experts, top-{k}, hidden {size}, FFN {ffn}"
            f"{biases}")


def _call(ctx: RewriteContext, block: _Block, target, args, kwargs=None) -> torch.fx.Node:
    """ctx.call, the new node credited to the module and source line of the block's row gather."""
    node = ctx.call(target, args, kwargs)
    node.meta.update({key: block.gather.meta[key] for key in ("nn_module_stack", "stack_trace", "source_fn_stack")
                      if key in block.gather.meta})
    return node


# ---- graph helpers --------------------------------------------------------------------------------------------
def _is_tensor(node: torch.fx.Node) -> bool:
    return isinstance(node_value(node), torch.Tensor)


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    return getattr(target, "__name__", str(target)) if node.op == "call_function" else node.op


def _same_size(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return sympy.simplify(a.node.expr - b.node.expr) == 0


def _reachable(nodes: Iterable[torch.fx.Node], step) -> set[torch.fx.Node]:
    """Every node reached from the given ones (not themselves) by following `step` (a node's neighbours)."""
    seen: set[torch.fx.Node] = set()
    stack = [next_node for node in nodes for next_node in step(node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(step(node))
    return seen


def _ancestors(nodes: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    """Every node the given ones are computed from (not themselves)."""
    return _reachable(nodes, lambda node: node.all_input_nodes)


def _descendants(*nodes: torch.fx.Node) -> set[torch.fx.Node]:
    """Every node computed from the given ones (not themselves)."""
    return _reachable(nodes, lambda node: node.users)


def _in_graph_order(ctx: RewriteContext, nodes: set[torch.fx.Node]) -> list[torch.fx.Node]:
    return [node for node in ctx.graph.nodes if node in nodes]


def _block_name(gemm: torch.fx.Node) -> str:
    """The module path of the block: the innermost module around its router and its experts (the gate+up GEMM's
    own where no router is found). Its router is the last one before it in graph order: the earlier blocks' routers
    are its ancestors too (a set's order would pick any of them)."""
    ancestors = _ancestors([gemm])
    routers = [node for node in gemm.graph.nodes
               if node in ancestors and node.op == "call_function" and node.target in ROUTER_OPS]
    paths = [module_path(gemm)] + [module_path(node) for node in routers[-1:]]
    return common_prefix(path for path in paths if path is not None)
