"""Partition -> ONNX: edge program to ATen, routing rewrites, torch.onnx export.

The result names its dynamic dimensions as the user named them (the
torch.export Dim name, else "input:axis") and gives each its range: from
CompileOptions.shape_ranges when set there, else the program's range
constraints. Integer (SymInt) inputs are recomputed from tensor inputs
(size_inputs.py). Weights are ONNX initializers, stored once, as the model holds
them, in the recipe's precision (precision.py; grouped GEMM weights are not transposed:
GroupedMM takes trans_b), or with expert_precision "fp8" as FP8 weights and their scales
(fp8_experts.py), with "int4" as packed INT4 weights and their group scales (int4_experts.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re

import onnx
import onnx_ir
import onnx_ir.passes.common
import sympy
import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from et_trt_backend.onnx_analysis import MOE_BLOCKS_METADATA_KEY
from et_trt_backend.options import CompileOptions, int4_group_size
from et_trt_backend.plugin_names import ACTIVATIONS
from et_trt_backend.program_inputs import user_input_nodes
from et_trt_backend.recipe import dynamic_dims
from et_trt_backend.serialization import external_data
from et_trt_backend.serialization.blob import CheckSpec, DimSpec, TensorSpec, WeightRecord

from . import checks, routing_rewrites, translations
from .errors import LoweringError
from . import fp8_experts, int4_experts
from .fp8_swiglu import fuse_swiglu
from .moe_fusion import FUSED, MoEBlockForm, fuse_moe_blocks
from .precision import apply_precision, truncate_double
from .size_inputs import inline_size_inputs
from .to_aten import aten_target, to_aten_program

logger = logging.getLogger(__name__)

_ONNX_TO_TORCH = {
    onnx.TensorProto.BFLOAT16: torch.bfloat16, onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool,
}


@dataclasses.dataclass(frozen=True)
class GroupedMMUse:
    """One GroupedMM in the ONNX: what the kernel images must cover."""

    dtype: str  # "bf16" | "fp16": the activations' and the output's
    trans_b: bool
    # "dense" (weights in dtype) | "fp8" (e4m3 [G, N, K], trans_b, per-channel scales) | "int4" (packed [G, N, K],
    # trans_b, bf16 group scales)
    weight_format: str = "dense"
    swiglu: bool = False  # fp8: its input is a gate+up output (fp8_swiglu.py), quantized by the SwiGLU images


@dataclasses.dataclass
class LoweredPartition:
    onnx: onnx.ModelProto  # initializers of MIN_EXTERNAL_BYTES or more are external: `weights`
    inputs: list[TensorSpec]  # in the delegate call's argument order
    outputs: list[TensorSpec]
    grouped_mms: list[GroupedMMUse]  # kernel-form GroupedMM nodes (none when lowered densely)
    weights: list[WeightRecord]  # the external initializers, their bytes in files (external_data.py)
    moe_blocks: list[MoEBlockForm] = dataclasses.field(default_factory=list)  # each MoE block's form, and why
    checks: list[CheckSpec] = dataclasses.field(default_factory=list)  # outputs the runtime checks (checks.py)

    @property
    def fused_blocks(self) -> list[MoEBlockForm]:
        """The MoE blocks lowered to one MoEExperts node each."""
        return [form for form in self.moe_blocks if form.form == FUSED]

    @property
    def onnx_bytes(self) -> bytes:
        return self.onnx.SerializeToString()

    def with_weights(self) -> onnx.ModelProto:
        """The ONNX with its weights inline (for onnxruntime and the reference evaluator)."""
        return external_data.onnx_with_weights(self.onnx_bytes, self.weights)


@dataclasses.dataclass(frozen=True)
class _DynamicDim:
    name: str
    min: int
    opt: int
    max: int


def _check_tensor_inputs(program: torch.export.ExportedProgram) -> None:
    for node in user_input_nodes(program):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise LoweringError(
                f"partition input '{node.name}' is a {type(value).__name__} ({value}), not a tensor; a "
                "TensorRT engine takes tensors only (and integer sizes that a tensor input carries). The "
                "partitioner should compute such values inside the partition"
            )


def _check_no_data_dependent_sizes(program: torch.export.ExportedProgram) -> None:
    for node in program.graph.nodes:
        symbols = free_unbacked_symbols(node.meta.get("val"))
        if symbols:
            raise LoweringError(
                f"node '{node.name}' has a size ({', '.join(sorted(map(str, symbols)))}) that depends on the data; "
                "TensorRT engines need sizes that follow from the input shapes (TensorRTPartitioner leaves such "
                "ops to ExecuTorch)"
            )


@contextlib.contextmanager
def _outside_unbacked_symbols_set_aside(program: torch.export.ExportedProgram):
    """Sets aside the shape environment's pending unbacked symbols while the partition is lowered.

    A partition shares its fake tensors' shape environment with the whole program. Where the program
    holds data-dependent ops outside the partition (nonzero, a mask index), ExecuTorch's passes leave
    their fresh unbacked symbols pending there, and the next trace of any op in that environment (the
    ONNX exporter's) fails with PendingUnbackedSymbolNotFound. Once rewritten, the partition holds no such
    symbol (_check_no_data_dependent_sizes), so they are none of its business.
    """
    fake_mode = detect_fake_mode([n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"])
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        yield
        return
    pending = list(shape_env.pending_fresh_unbacked_symbols)
    shape_env.pending_fresh_unbacked_symbols.clear()
    try:
        yield
    finally:
        shape_env.pending_fresh_unbacked_symbols[:0] = pending


def _ranges(program, options: CompileOptions) -> dict[str, _DynamicDim]:
    """Each input symbol's name and profile, by symbol name. Names as recipes name the symbol
    (recipe.dynamic_dims): its torch.export Dim name, then "input:axis" of the exported model's
    inputs, then of this partition's. Profiles as the partitioner resolves them
    (DynamicDim.shape_range)."""
    dims = dynamic_dims(program)
    ranges = {}
    for symbol, dim in dims.items():
        rng = dim.shape_range(options.shape_ranges)
        ranges[symbol] = _DynamicDim(dim.name, rng.min, rng.opt, rng.max)
    known = {a for dim in dims.values() for a in dim.names}
    unused = sorted(set(options.shape_ranges) - known)
    if unused:
        logger.info("shape_ranges %s name no dynamic dimension of this partition (it has %s)",
                    unused, sorted(known) or "none")
    return ranges


def _dim_spec(dim: onnx.TensorShapeProto.Dimension, by_symbol: dict[str, _DynamicDim]) -> DimSpec:
    """The spec of one ONNX dimension; dim_param is an expression of symbols ("s77", "2*s77")."""
    if dim.HasField("dim_value"):
        return DimSpec(dim.dim_value, "", dim.dim_value, dim.dim_value, dim.dim_value)
    expr = sympy.sympify(dim.dim_param, locals={s: sympy.Symbol(s) for s in by_symbol})
    unknown = expr.free_symbols - {sympy.Symbol(s) for s in by_symbol}
    if unknown:
        raise LoweringError(
            f"an input or output has a size ({dim.dim_param}) that depends on the data; TensorRT needs "
            "output sizes computable from input shapes"
        )
    at = lambda field: int(expr.subs({sympy.Symbol(s): getattr(d, field) for s, d in by_symbol.items()}))  # noqa: E731
    name = str(expr.subs({sympy.Symbol(s): sympy.Symbol(d.name) for s, d in by_symbol.items()}))
    return DimSpec(None, name, at("min"), at("opt"), at("max"))


def _rename_dims(model: onnx.ModelProto, by_symbol: dict[str, _DynamicDim]) -> None:
    """dim_param "s77" -> the user's name ("tokens"), everywhere in the graph."""
    if not by_symbol:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(by_symbol, key=len, reverse=True))) + r")\b")
    graph = model.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = pattern.sub(lambda m: by_symbol[m.group(1)].name, dim.dim_param)


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    """Removes each node's "pkg.torch.onnx.stack_trace": it holds the absolute paths of the
    model's source files, and an export must not depend on where it ran (same model and
    options, same bytes and content id). The other metadata (module path, FX node) stays."""
    for node in [*model.graph.node, *(n for f in model.functions for n in f.node)]:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def _tensor_specs(values, by_symbol) -> list[TensorSpec]:
    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        dims = [_dim_spec(d, by_symbol) for d in tensor_type.shape.dim]
        specs.append(TensorSpec(value.name, _ONNX_TO_TORCH[tensor_type.elem_type], dims))
    return specs


def _grouped_mm_uses(program: torch.export.ExportedProgram, kernel: bool, ranges) -> list[GroupedMMUse]:
    """The kernel-form GroupedMMs; logs the cost of each one lowered densely."""
    uses = []
    for node in program.graph.nodes:
        if node.target is torch.ops.et_trt_lowering.grouped_mm_fp8.default:
            swiglu = len(node.args) > 4 and node.args[4] == ACTIVATIONS["swiglu"]
            uses.append(GroupedMMUse(translations.KERNEL_DTYPES[node.args[0].meta["val"].dtype], True, "fp8", swiglu))
            continue
        if node.target is torch.ops.et_trt_lowering.grouped_mm_int4.default:
            uses.append(GroupedMMUse(translations.KERNEL_DTYPES[node.args[0].meta["val"].dtype], True, "int4"))
            continue
        if node.target is not torch.ops.et_trt_lowering.grouped_mm.default:
            continue
        a, b = node.args[0].meta["val"], node.args[1].meta["val"]
        dtype = translations.KERNEL_DTYPES.get(a.dtype)
        if kernel and dtype:
            uses.append(GroupedMMUse(dtype, bool(node.args[3])))
            continue
        rows = a.shape[0]
        expr = sympy.sympify(rows if isinstance(rows, int) else rows.node.expr)
        rows_opt = int(expr.subs({s: ranges[str(s)].opt for s in expr.free_symbols}))
        groups, k = b.shape[0], a.shape[1]
        n = b.shape[-2] if node.args[3] else b.shape[-1]
        grouped = rows_opt * k * n
        why = "grouped_gemm_kernel = false" if not kernel else f"no grouped-GEMM kernel for {a.dtype}"
        logger.warning(
            "%s lowered densely (%s): %d x the multiply-adds of the grouped form, %.3g vs %.3g at %d rows "
            "(the profile's opt), and a [%d, rows, %d] intermediate",
            node.name, why, groups, groups * grouped, grouped, rows_opt, groups, n)
    return uses


@functools.cache
def _export_registry(grouped_gemm_kernel: bool):
    """The ONNX exporter's op registry: torchlib's translations, and ours (translations.translation_table) before
    them, as torch.onnx.export builds it. Built once per process: torch.onnx.export builds it anew for every
    partition (about 0.5 CPU-second each; the first, 0.9)."""
    from torch.onnx._internal.exporter import _constants, _registration

    registry = _registration.ONNXRegistry.from_torchlib(
        opset_version=max(translations.ONNX_OPSET, _constants.TORCHLIB_OPSET))
    for target, function in translations.translation_table(grouped_gemm_kernel).items():
        registry.register_op(target, function, is_complex=False)
    return registry


def _export(program: torch.export.ExportedProgram, grouped_gemm_kernel: bool):
    """torch.onnx.export(program, dynamo=True, custom_translation_table=translations.translation_table(...),
    optimize=True) with the registry built once (_export_registry); the same ONNXProgram."""
    from torch.onnx._internal.exporter import _core

    return _core.export(
        program,
        registry=_export_registry(grouped_gemm_kernel),
        dynamic_shapes={},
        input_names=list(program.graph_signature.user_inputs),
        opset_version=translations.ONNX_OPSET,
        optimize=True,
        verbose=False,
    )


@functools.cache
def _onnx_decompositions():
    from torch.onnx._internal.exporter import _decomp

    return _decomp.create_onnx_friendly_decomposition_table(
        _decomp.get_onnx_implemented_overloads(_export_registry(True)))


def _quantized_experts(program, options: CompileOptions, moe_blocks: list[MoEBlockForm]) -> list[MoEBlockForm]:
    """The program's experts made FP8 (fp8_experts.py) or INT4 (int4_experts.py), per expert_precision; the fused
    blocks' forms saying so."""
    if options.expert_precision == "fp8":
        weights = "FP8 weights (e4m3, a float32 scale per output channel)"
        fused, grouped = fp8_experts.quantize_experts(program)
        logger.info("expert_precision fp8: %d of the GroupedMM(s) compute their input's SwiGLU", fuse_swiglu(program))
    else:
        group_size = int4_group_size(options)
        weights = f"INT4 weights (group {group_size})"
        fused, grouped = int4_experts.quantize_experts(program, group_size)
    logger.info("expert_precision %s: %d MoEExperts node(s) and %d GroupedMM(s) with %s", options.expert_precision,
                fused, grouped, weights)
    return [dataclasses.replace(form, detail=f"{form.detail}, {weights}") if form.form == FUSED else form
            for form in moe_blocks]


def has_translation(target) -> bool:
    """Whether the lowering translates `target` (an ATen, edge or dim-order overload) to ONNX:
    by a rewrite, as an engine check (checks.py), an et-trt translation, torchlib, or a decomposition into those."""
    target = aten_target(target)
    return (target in routing_rewrites.REWRITTEN_TARGETS or target in checks.TARGETS
            or _export_registry(True).is_registered(target) or target in _onnx_decompositions())


def lower_to_onnx(edge_program: torch.export.ExportedProgram, options: CompileOptions) -> LoweredPartition:
    """The partition as TensorRT-parseable ONNX, with its IO specs."""
    with _outside_unbacked_symbols_set_aside(edge_program):
        return _lower(edge_program, options)


def _lower(edge_program: torch.export.ExportedProgram, options: CompileOptions) -> LoweredPartition:
    program = to_aten_program(edge_program)
    inline_size_inputs(program)
    routing_rewrites.rewrite(program)
    _check_no_data_dependent_sizes(program)  # after the rewrites, which give bincount of expert ids a static size
    _check_tensor_inputs(program)
    if options.truncate_double:
        truncate_double(program)
    apply_precision(program, options.precision)
    moe_blocks = fuse_moe_blocks(program, options)
    if options.expert_precision in ("fp8", "int4"):
        moe_blocks = _quantized_experts(program, options, moe_blocks)
    elif options.int4_group_size is not None:
        logger.warning("int4_group_size = %d has no effect on this part: its expert_precision is %s, not \"int4\"",
                       options.int4_group_size, f'"{options.expert_precision}"' if options.expert_precision else
                       f"unset (its experts stay {options.precision})")
    messages = checks.checks_to_outputs(program)
    ranges = _ranges(program, options)
    kernel = options.grouped_gemm_kernel
    grouped_mms = _grouped_mm_uses(program, kernel, ranges)

    logger.info("exporting partition to ONNX (opset %d)", translations.ONNX_OPSET)
    onnx_program = _export(program, kernel)
    # One name per value: the exporter names the inputs after the partition's arguments (say "getitem_3", a
    # delegate's output in the program) after naming the values inside after their FX nodes, which can
    # give an inner value the same name; NVIDIA's parser then finds a cycle. Inputs and outputs keep theirs.
    onnx_ir.passes.common.NameFixPass()(onnx_program.model)
    # The weights leave for files first: no protobuf ever holds them (one stops at 2 GiB).
    weights = external_data.move_weights_out(onnx_program.model)
    model = onnx_program.model_proto
    _drop_stack_traces(model)
    inputs = _tensor_specs(model.graph.input, ranges)
    outputs = _tensor_specs(model.graph.output, ranges)
    own = len(outputs) - len(messages)  # the checks' outputs follow the partition's own
    outputs, check_outputs = outputs[:own], outputs[own:]
    _rename_dims(model, ranges)
    if moe_blocks:  # for `et-trt inspect` (onnx_analysis.moe_blocks)
        model.metadata_props.add(key=MOE_BLOCKS_METADATA_KEY, value=json.dumps([b.to_json() for b in moe_blocks]))
    return LoweredPartition(onnx=model, inputs=inputs, outputs=outputs, grouped_mms=grouped_mms, weights=weights,
                            moe_blocks=moe_blocks, checks=[CheckSpec(o, m) for o, m in zip(check_outputs, messages)])
