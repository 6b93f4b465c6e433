"""et_trt::GroupedMM nodes must match the plugin (contract 4): attributes through
which the parser finds it, three inputs a [rows, K], b [G, K, N] (or [G, N, K]
with trans_b=1), offs int32 [G]; a and b bf16 or fp16; output [rows, N] of a's type.
The FP8 form has a fourth input, b_scale float32 [G, N]: b is then e4m3 weights
[G, N, K] of the type plugin_names.FP8_WEIGHT_ONNX_TYPE, trans_b=1; with attribute
activation=1 its a is a gate+up output [rows, 2K] (plugin_names.ACTIVATIONS). The INT4 form (attribute
group_size 32, 64 or 128) has the fourth input too: b is packed INT4 bytes typed INT8 [G, N, round_up(K, 32) / 2] with
trans_b=1 and b_scale BF16 [G, N, ceil(K / group_size)] (et_trt_backend/int4_weights.py)."""

from __future__ import annotations

from collections.abc import Iterator

from onnx import TensorProto

from et_trt_backend.plugin_names import (
    ACTIVATION_ATTRIBUTE,
    ACTIVATIONS,
    FP8_WEIGHT_ONNX_TYPE,
    GROUPED_MM_DOMAIN,
    GROUPED_MM_OP,
    INT4_GROUP_SIZE_ATTRIBUTE,
    INT4_WEIGHT_ONNX_TYPE,
    PLUGIN_ATTRIBUTES,
)
from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, NodeRef, attributes_of
from et_trt_backend.preflight.violation import Violation

RULE = "grouped_mm"
_KERNEL_DTYPES = {TensorProto.BFLOAT16, TensorProto.FLOAT16}
_FP8_WEIGHT_DTYPE = TensorProto.DataType.Value(FP8_WEIGHT_ONNX_TYPE)
_INT4_WEIGHT_DTYPE = TensorProto.DataType.Value(INT4_WEIGHT_ONNX_TYPE)
_INT4_GROUP_SIZES = (32, 64, 128)  # int4_weights.GROUP_SIZES (no torch here)


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if (node.domain, node.op_type) == (GROUPED_MM_DOMAIN, GROUPED_MM_OP):
            for problem in _problems(view, ref):
                yield Violation.at(RULE, ref, problem)


def plugin_attribute_problems(attrs: dict) -> Iterator[str]:
    """The attributes through which TensorRT's parser finds our plugins (PLUGIN_ATTRIBUTES), where wrong."""
    for name, expected in PLUGIN_ATTRIBUTES.items():
        if attrs.get(name) != expected.encode():
            yield f"attribute {name} must be the string {expected!r} (the plugin's registration), got {attrs.get(name)!r}"


def _problems(view: ModelView, ref: NodeRef) -> Iterator[str]:
    node = ref.node
    attrs = attributes_of(node)
    yield from plugin_attribute_problems(attrs)
    trans_b = attrs.get("trans_b")
    if trans_b not in (0, 1):
        yield f"attribute trans_b must be the int 0 or 1, got {trans_b!r}"
    if len(node.input) not in (3, 4) or not all(node.input) or len(node.output) != 1:
        yield (f"needs inputs (a, b, offs), or (a, b, offs, b_scale) for FP8 weights, and one output, got "
               f"{len(node.input)} inputs, {len(node.output)} outputs")
        return
    a, b, offs = node.input[:3]
    group_size = attrs.get(INT4_GROUP_SIZE_ATTRIBUTE, 0)
    if group_size:
        yield from _int4_problems(view, node, trans_b, attrs, group_size)
        return
    fp8 = len(node.input) == 4
    activation = attrs.get(ACTIVATION_ATTRIBUTE, ACTIVATIONS["none"])
    if activation not in ACTIVATIONS.values():
        yield f"attribute {ACTIVATION_ATTRIBUTE} must be an int of {ACTIVATIONS}, got {activation!r}"
    elif activation != ACTIVATIONS["none"] and not fp8:
        yield f"attribute {ACTIVATION_ATTRIBUTE}={activation} (a gate+up output as a) is the FP8 form's only"
    a_columns = 2 if activation == ACTIVATIONS["swiglu"] else 1  # a gate+up output holds 2K
    types = {name: view.elem_type(name) for name in (*node.input, node.output[0])}
    if types[a] is not None and types[a] not in _KERNEL_DTYPES:
        yield f"a is {trt.dtype_name(types[a])}; the kernel takes BF16 or FP16 (fp32 grouped mm is lowered densely)"
    if fp8:
        yield from _fp8_problems(view, node, trans_b)
    elif None not in (types[a], types[b]) and types[a] != types[b]:
        yield f"a is {trt.dtype_name(types[a])} but b is {trt.dtype_name(types[b])}: they must match"
    if types[offs] is not None and types[offs] != TensorProto.INT32:
        yield f"offs is {trt.dtype_name(types[offs])}; the plugin takes INT32 offsets"
    out = node.output[0]
    if None not in (types[a], types[out]) and types[out] != types[a]:
        yield f"output is {trt.dtype_name(types[out])} but a is {trt.dtype_name(types[a])}: they must match"
    shapes = {name: view.shape(name) for name in (a, b, offs)}
    for name, what, rank in ((a, "a", 2), (b, "b", 3), (offs, "offs", 1)):
        if shapes[name] is not None and len(shapes[name]) != rank:
            yield f"{what} has rank {len(shapes[name])}, the plugin needs rank {rank}"
            return
    if shapes[a] and shapes[b] and trans_b in (0, 1):
        k_a, k_b = shapes[a][1], shapes[b][2 if trans_b else 1]
        if isinstance(k_a, int) and isinstance(k_b, int) and k_a != a_columns * k_b:
            yield (f"a's K ({k_a}) differs from b's K ({k_b}, trans_b={trans_b})" if a_columns == 1 else
                   f"a ({k_a} columns) is not a gate+up output of 2 x b's K ({k_b}) (activation={activation})")
    if shapes[b] and shapes[offs]:
        groups, count = shapes[b][0], shapes[offs][0]
        if isinstance(groups, int) and isinstance(count, int) and groups != count:
            yield f"offs has {count} entries but b has {groups} groups"


def _fp8_problems(view: ModelView, node, trans_b) -> Iterator[str]:
    """The FP8 form: b e4m3 (or its bits as INT8) [G, N, K] with trans_b=1, b_scale FP32 [G, N]."""
    if trans_b != 1:
        yield f"the FP8 form (4 inputs) takes b as [G, N, K] only: trans_b must be 1, got {trans_b!r}"
    yield from fp8_weight_problems(view, "b", node.input[1], "b_scale", node.input[3])


def fp8_weight_problems(view: ModelView, role: str, weights: str, scale_role: str, scale: str) -> Iterator[str]:
    """FP8 weights `weights` [G, N, K] e4m3 (FP8_WEIGHT_ONNX_TYPE) with FP32 scales `scale` [G, N]: the problems
    found."""
    weight_type, scale_type = view.elem_type(weights), view.elem_type(scale)
    if weight_type is not None and weight_type != _FP8_WEIGHT_DTYPE:
        yield (f"{role} is {trt.dtype_name(weight_type)} but the node has {scale_role} (the FP8 form): {role} must be "
               f"{trt.dtype_name(_FP8_WEIGHT_DTYPE)}, the e4m3 weights the plugin reads")
    if scale_type is not None and scale_type != TensorProto.FLOAT:
        yield f"{scale_role} is {trt.dtype_name(scale_type)}; the plugin takes FP32 scales"
    shape, scales = view.shape(weights), view.shape(scale)
    if shape is not None and scales is not None and len(shape) == 3:
        if len(scales) != 2 or any(isinstance(x, int) and isinstance(y, int) and x != y
                                   for x, y in zip(scales, shape[:2])):
            yield f"{scale_role} is {list(scales)}, but {role} [G, N, K] = {list(shape)} needs {scale_role} [G, N]"


def _int4_problems(view: ModelView, node, trans_b, attrs: dict, group_size) -> Iterator[str]:
    """The INT4 form: a [rows, K] bf16/fp16, b packed [G, N, Kp / 2] INT8 with trans_b=1, offs INT32 [G], b_scale
    BF16 [G, N, ceil(K / group_size)], the output of a's type; activation 0."""
    if len(node.input) != 4:
        yield f"{INT4_GROUP_SIZE_ATTRIBUTE}={group_size} (the INT4 form) needs inputs (a, b, offs, b_scale)"
        return
    a, b, offs, b_scale = node.input
    if trans_b != 1:
        yield f"the INT4 form takes b as [G, N, K] only: trans_b must be 1, got {trans_b!r}"
    if attrs.get(ACTIVATION_ATTRIBUTE, ACTIVATIONS["none"]) != ACTIVATIONS["none"]:
        yield f"attribute {ACTIVATION_ATTRIBUTE} must be 0 in the INT4 form (a holds the activations)"
    types = {name: view.elem_type(name) for name in (a, offs, node.output[0])}
    if types[a] is not None and types[a] not in _KERNEL_DTYPES:
        yield f"a is {trt.dtype_name(types[a])}; the INT4 kernels take BF16 or FP16 activations"
    if types[offs] is not None and types[offs] != TensorProto.INT32:
        yield f"offs is {trt.dtype_name(types[offs])}; the plugin takes INT32 offsets"
    if None not in (types[a], types[node.output[0]]) and types[node.output[0]] != types[a]:
        yield f"output is {trt.dtype_name(types[node.output[0]])} but a is {trt.dtype_name(types[a])}: they must match"
    shape_a = view.shape(a)
    k = shape_a[1] if shape_a is not None and len(shape_a) == 2 else None
    yield from int4_weight_problems(view, "b", b, "b_scale", b_scale, k, group_size)


def int4_weight_problems(view: ModelView, role: str, packed: str, scale_role: str, scale: str, k, group_size) \
        -> Iterator[str]:
    """Packed INT4 weights `packed` [G, N, round_up(K, 32) / 2] INT8 with BF16 scales `scale` [G, N, ceil(K / g)]
    (K checked where it is a known int), g = `group_size` 32, 64 or 128: the problems found."""
    if group_size not in _INT4_GROUP_SIZES:
        yield f"attribute {INT4_GROUP_SIZE_ATTRIBUTE} must be 0 or one of {_INT4_GROUP_SIZES}, got {group_size!r}"
        return
    if view.elem_type(packed) not in (None, _INT4_WEIGHT_DTYPE):
        yield (f"{role} is {trt.dtype_name(view.elem_type(packed))}; INT4 weights are packed "
               f"{trt.dtype_name(_INT4_WEIGHT_DTYPE)} bytes")
    if view.elem_type(scale) not in (None, TensorProto.BFLOAT16):
        yield f"{scale_role} is {trt.dtype_name(view.elem_type(scale))}; INT4 scales are BF16"
    shape, scales = view.shape(packed), view.shape(scale)
    if shape is None or scales is None:
        return
    if len(shape) != 3 or len(scales) != 3:
        yield f"{role} {list(shape)} and {scale_role} {list(scales)} must both be rank 3"
        return
    want = list(shape[:2])
    if isinstance(k, int):
        want_packed, want_scales = [*want, -(-k // 32) * 16], [*want, -(-k // group_size)]
        if list(shape) != want_packed or list(scales) != want_scales:
            yield (f"{role} {list(shape)} and {scale_role} {list(scales)} are not the INT4 form of [G, N, K = {k}] "
                   f"weights at group {group_size}: want {want_packed} and {want_scales}")
    elif list(scales[:2]) != want:
        yield f"{scale_role} is {list(scales)}, but {role} [G, N, Kp / 2] = {list(shape)} needs [G, N, groups]"
