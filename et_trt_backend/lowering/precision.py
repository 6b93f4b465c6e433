"""The recipe's `precision` and `truncate_double`, written into a partition's ATen program before ONNX export.

truncate_double first (TensorRT has no float64): the partition's float64 computations become float32 ones,
each logged with its source line, before the rule below, which then keeps them as float32 islands.

TensorRT 11 and TensorRT for RTX build strongly typed networks only, and et-trt
builds TensorRT 10 networks strongly typed too (runtime tensorrt_builder.cc): the
ONNX's own types are the engine's precision. So the lowering casts the
partition here, and the ONNX carries the precision in its weights
(initializers), activations and GroupedMM inputs (hence the kernel images'
dtype, backend._kernel_images).

The rule: the model's low-precision dtype (its bf16 or fp16 tensors: weights,
inputs, activations) becomes the requested one; float32 stays float32, except
under precision fp32, which makes every floating tensor float32 (TensorRT may
use TF32 for it when `tf32` is on; GroupedMM has no fp32 kernel and is lowered
densely). Float32 in a bf16/fp16 model is there on purpose: a router's
`.float()` softmax, RMSNorm's float32 variance, a float32 timestep embedding,
expert ids cast to float for histc (bf16 holds integers exactly only to 256),
and PyTorch's own float32 math inside low-precision SiLU (its decomposition
upcasts, as eager PyTorch does). These islands guard range and exactness, cost
little, and are what the same model computes in PyTorch at that precision
(`model.half()` keeps them). A partition without bf16/fp16 tensors is float32
by the model's choice and cannot be told apart from its deliberate float32 (its
routing floats included): it stays float32, and the export warns that the
requested precision had nothing to change (convert the model before export).

What changes: weights of the working dtype are converted, dtype arguments naming
it (casts, factories) name the requested one, and factories that made it by
default say so. Every value is then re-typed by fake propagation. The partition's
inputs and outputs keep the dtypes ExecuTorch passes and expects: casts at the
boundary, inside the ONNX.

What cannot be honoured is said: a weight or constant that overflows fp16 is an
error naming it; a scalar argument beyond fp16's range (a -1e9 attention mask
fill becomes -inf) is a warning naming the op and its source line. An op
TensorRT cannot run in the requested type is reported by the pre-flight check
(its dtypes rule) after lowering.
"""

from __future__ import annotations

import logging

import torch
from torch._guards import detect_fake_mode
from torch.export.graph_signature import InputKind, TensorArgument
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils import _pytree as pytree

from et_trt_backend.op_support import holds_float64
from et_trt_backend.program_inputs import user_input_nodes
from et_trt_backend.source_lines import source_line

from .errors import LoweringError

logger = logging.getLogger(__name__)
aten = torch.ops.aten

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_LOW = (torch.bfloat16, torch.float16)
_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _float_dtypes(program: torch.export.ExportedProgram) -> set[torch.dtype]:
    """The floating dtypes of every tensor value in the program's graph."""
    found = set()
    for node in program.graph.nodes:
        for value in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
                found.add(value.dtype)
    return found


def _weights(program: torch.export.ExportedProgram):
    """(placeholder, store, key) of each weight, buffer and lifted constant tensor."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for spec in program.graph_signature.input_specs:
        if spec.kind not in _WEIGHT_KINDS:
            continue
        store = program.state_dict if spec.target in program.state_dict else program.constants
        if isinstance(store.get(spec.target), torch.Tensor):
            yield placeholders[spec.arg.name], store, spec.target


def _cast_weights(program, mapping, fake_mode, what: str, fix: str) -> int:
    overflowing = []
    count = 0
    for node, store, key in _weights(program):
        value = store[key]
        target = mapping.get(value.dtype)
        if target is None:
            continue
        cast = value.detach().to(target)
        if torch.isinf(cast).logical_and(torch.isfinite(value)).any():
            overflowing.append(f"'{key}' (largest magnitude {value.detach().abs().max().item():.4g})")
        store[key] = torch.nn.Parameter(cast, requires_grad=False) if isinstance(value, torch.nn.Parameter) else cast
        with fake_mode:
            node.meta["val"] = node.meta["val"].to(target)
        count += 1
    if overflowing:
        largest = torch.finfo(next(iter(mapping.values()))).max
        raise LoweringError(f"{what} cannot hold {', '.join(overflowing)}: the values overflow to inf (largest "
                            f"finite {largest:.6g}). {fix}")
    return count


def _cast_inputs(program, mapping) -> int:
    """Each user input of a working dtype is cast to the requested one right after it arrives."""
    inputs = [n for n in user_input_nodes(program) if n.meta["val"].dtype in mapping]
    graph = program.graph
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    for node in inputs:
        with graph.inserting_before(first_op):
            cast = graph.call_function(aten._to_copy.default, (node,), {"dtype": mapping[node.meta["val"].dtype]})
        node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
    return len(inputs)


def _retarget_dtype_arguments(program, mapping) -> None:
    """dtype arguments naming a working dtype name the requested one; factories that made a working
    dtype by default (the default dtype at export) are given the requested one explicitly."""
    swap = lambda v: mapping.get(v, v) if isinstance(v, torch.dtype) else v  # noqa: E731
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        node.args, node.kwargs = pytree.tree_map(swap, (node.args, node.kwargs))
        schema = getattr(node.target, "_schema", None)
        value = node.meta.get("val")
        if (schema is not None and isinstance(value, torch.Tensor) and value.dtype in mapping
                and any(a.name == "dtype" and a.kwarg_only for a in schema.arguments)
                and node.kwargs.get("dtype") is None):
            node.kwargs = {**node.kwargs, "dtype": mapping[value.dtype]}


def _output_dtypes(program) -> list[torch.dtype | None]:
    return [v.meta["val"].dtype if isinstance(v, torch.fx.Node) else None
            for v in pytree.tree_leaves(program.graph.output_node().args)]


def _cast_outputs(program, dtypes: list[torch.dtype | None]) -> int:
    """Each output leaves in the dtype it had (`dtypes`, by position): a cast back where the
    precision changed it. The graph signature names the casts as the outputs."""
    graph = program.graph
    output = graph.output_node()
    values, spec = pytree.tree_flatten(output.args)
    casts = {}  # output position -> cast node
    for i, (value, dtype) in enumerate(zip(values, dtypes)):
        if not isinstance(value, torch.fx.Node) or value.meta["val"].dtype == dtype:
            continue
        with graph.inserting_before(output):
            casts[i] = graph.call_function(aten._to_copy.default, (value,), {"dtype": dtype})
        casts[i].meta["val"] = value.meta["val"].to(dtype)
    if casts:
        output.args = pytree.tree_unflatten([casts.get(i, v) for i, v in enumerate(values)], spec)
        for i, cast in casts.items():
            program.graph_signature.output_specs[i].arg = TensorArgument(name=cast.name)
    return len(casts)


def _warn_out_of_range_scalars(program, target: torch.dtype) -> None:
    if target is not torch.float16:
        return
    largest = torch.finfo(target).max
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op != "call_function" or not isinstance(value, torch.Tensor) or value.dtype is not target:
            continue
        for arg in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(arg, float) and largest < abs(arg) < float("inf"):
                logger.warning("%s at %s: the constant %g is beyond fp16's range (%g) and becomes %sinf in fp16",
                               node.name, source_line(node), arg, largest, "-" if arg < 0 else "")


def _propagate(program, fake_mode) -> None:
    """Every meta value recomputed from the (re-typed) placeholders."""
    program.graph_module.recompile()
    FakeTensorProp(program.graph_module, mode=fake_mode).propagate_dont_convert_inputs(
        *[n.meta["val"] for n in program.graph.nodes if n.op == "placeholder"])


def truncate_double(program: torch.export.ExportedProgram) -> None:
    """CompileOptions.truncate_double: the partition's float64 weights, constants and dtype arguments become
    float32, so every op that computed in float64 computes in float32; each is logged with its source line.
    Its inputs and outputs are never float64 (TensorRTPartitioner leaves those casts to ExecuTorch); a
    program that has them is refused."""
    boundary = [n.name for n in [*user_input_nodes(program), *pytree.tree_leaves(program.graph.output_node().args)]
                if holds_float64(n)]
    if boundary:
        raise LoweringError(f"partition inputs or outputs {boundary} are float64, which TensorRT does not bind; "
                            "cast them to float32 outside the partition (TensorRTPartitioner leaves such casts "
                            "to ExecuTorch)")
    narrowed = [n for n in program.graph.nodes if n.op == "call_function" and any(
        isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in pytree.tree_leaves(n.meta.get("val")))]
    if not narrowed:
        return
    for node in narrowed:
        logger.info("truncate_double: %s at %s computes in float32 instead of float64", node.name, source_line(node))
    mapping = {torch.float64: torch.float32}
    fake_mode = detect_fake_mode([n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"])
    _cast_weights(program, mapping, fake_mode, "truncate_double",
                  "Set truncate_double = false for this part (its float64 ops then stay on ExecuTorch)")
    _retarget_dtype_arguments(program, mapping)
    _propagate(program, fake_mode)
    logger.info("truncate_double: %d float64 ops of this partition compute in float32", len(narrowed))


def apply_precision(program: torch.export.ExportedProgram, precision: str) -> None:
    """Casts the ATen program (in place) to `precision` by the rule above. The program's state_dict
    and constants must be its own (to_aten_program copies them)."""
    target = DTYPES[precision]
    present = _float_dtypes(program)
    mapping = {d: target for d in present if d in _LOW and d is not target}
    if not mapping:
        if target is not torch.float32 and present == {torch.float32}:
            logger.warning(
                "precision = \"%s\": this partition has no bf16/fp16 tensor, only float32, which is kept (the "
                "model's own choice, routing floats included); the engine computes in float32. To run it in %s, "
                "convert the model before torch.export (model.to(torch.%s)); precision = \"fp32\" says float32",
                precision, precision, str(target).removeprefix("torch."))
        return
    graph = program.graph
    fake_mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    output_dtypes = _output_dtypes(program)
    weights = _cast_weights(program, mapping, fake_mode, f"precision = \"{precision}\"",
                            "Give this part precision = \"bf16\" or \"fp32\" in the recipe, or rescale those weights")
    inputs = _cast_inputs(program, mapping)
    _retarget_dtype_arguments(program, mapping)
    _propagate(program, fake_mode)
    outputs = _cast_outputs(program, output_dtypes)
    program.graph_module.recompile()
    _warn_out_of_range_scalars(program, target)
    names = {dtype: name for name, dtype in DTYPES.items()}
    islands = sum(1 for n in graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
                  and n.meta["val"].dtype is torch.float32)
    logger.info("precision %s: %s -> %s (%d weights); %d inputs and %d outputs cast at the partition boundary%s",
                precision, "/".join(names[d] for d in mapping), precision, weights, inputs, outputs,
                "" if target is torch.float32 else f"; {islands} float32 ops kept (islands)")
