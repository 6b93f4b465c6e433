"""et_trt::MoEExperts nodes must match the plugin (issue 32, et_trt_backend/moe_experts.py): the attributes
through which the parser finds it, and every attribute the plugin reads; inputs hidden [T, H] bf16 or fp16,
topk_ids int32 [T, k], topk_weights [T, k] float32 or hidden's type, w_gate_up [E, N1, H] and w_down
[E, H, F] of hidden's type (N1 = 2F for gated activations, else F), optional biases [E, N1] and [E, H]; one
output [T, H] of hidden's type. The INT4 form (attribute group_size 32, 64 or 128): w_gate_up and w_down packed INT4
(grouped_mm.int4_weight_problems), their BF16 scales inputs 7 and 8 after the biases (present: zeros where the model
has none). The FP8 form (those 9 inputs, group_size 0): w_gate_up and w_down e4m3 with FP32 scales [E, out]
(grouped_mm.fp8_weight_problems)."""

from __future__ import annotations

from collections.abc import Iterator

from onnx import TensorProto

from et_trt_backend.moe_experts import is_gated
from et_trt_backend.plugin_names import (
    GROUPED_MM_DOMAIN,
    MOE_ACTIVATION_ATTRIBUTE,
    MOE_ACTIVATIONS,
    MOE_ALPHA_ATTRIBUTE,
    INT4_GROUP_SIZE_ATTRIBUTE,
    MOE_EXPERTS_OP,
    MOE_GATE_UP_LAYOUTS,
    MOE_LAYOUT_ATTRIBUTE,
    MOE_LIMIT_ATTRIBUTE,
)
from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, NodeRef, attributes_of
from et_trt_backend.preflight.rules.grouped_mm import (
    fp8_weight_problems,
    int4_weight_problems,
    plugin_attribute_problems,
)
from et_trt_backend.preflight.violation import Violation

RULE = "moe_experts"
_KERNEL_DTYPES = {TensorProto.BFLOAT16, TensorProto.FLOAT16}
_INPUTS = ("hidden", "topk_ids", "topk_weights", "w_gate_up", "w_down", "b_gate_up", "b_down")
_QUANTIZED_INPUTS = (*_INPUTS, "w_gate_up_scale", "w_down_scale")
_RANKS = {"hidden": 2, "topk_ids": 2, "topk_weights": 2, "w_gate_up": 3, "w_down": 3, "b_gate_up": 2, "b_down": 2}


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        if (ref.node.domain, ref.node.op_type) == (GROUPED_MM_DOMAIN, MOE_EXPERTS_OP):
            for problem in _problems(view, ref):
                yield Violation.at(RULE, ref, problem)


def _problems(view: ModelView, ref: NodeRef) -> Iterator[str]:
    node = ref.node
    attrs = attributes_of(node)
    yield from plugin_attribute_problems(attrs)
    activation = next((name for name, value in MOE_ACTIVATIONS.items()
                       if value == attrs.get(MOE_ACTIVATION_ATTRIBUTE)), None)
    if activation is None:
        yield (f"attribute {MOE_ACTIVATION_ATTRIBUTE} must be an int of {MOE_ACTIVATIONS}, got "
               f"{attrs.get(MOE_ACTIVATION_ATTRIBUTE)!r}")
    layout = attrs.get(MOE_LAYOUT_ATTRIBUTE)
    if layout is None or layout.decode() not in MOE_GATE_UP_LAYOUTS:
        yield f"attribute {MOE_LAYOUT_ATTRIBUTE} must be a string of {MOE_GATE_UP_LAYOUTS}, got {layout!r}"
    for name in (MOE_ALPHA_ATTRIBUTE, MOE_LIMIT_ATTRIBUTE):
        if not isinstance(attrs.get(name), float):
            yield f"attribute {name} must be a float (every plugin field written), got {attrs.get(name)!r}"
    group_size = attrs.get(INT4_GROUP_SIZE_ATTRIBUTE, 0)
    if group_size and (len(node.input) != len(_QUANTIZED_INPUTS) or not all(node.input)):
        yield (f"{INT4_GROUP_SIZE_ATTRIBUTE}={group_size} (INT4 weights) needs all inputs "
               f"{', '.join(_QUANTIZED_INPUTS)} (zero biases where the model has none), got {len(node.input)} inputs "
               f"{list(node.input)}")
        return
    fp8 = not group_size and len(node.input) == len(_QUANTIZED_INPUTS)
    if fp8 and not all(node.input):
        yield (f"the FP8 form (9 inputs, {INT4_GROUP_SIZE_ATTRIBUTE} 0) needs all inputs "
               f"{', '.join(_QUANTIZED_INPUTS)} (zero biases where the model has none), got {list(node.input)}")
        return
    most = len(_QUANTIZED_INPUTS if group_size or fp8 else _INPUTS)
    if not 5 <= len(node.input) <= most or not all(node.input[:5]) or len(node.output) != 1:
        yield (f"needs inputs {', '.join(_INPUTS[:5])} (and the biases b_gate_up, b_down; FP8 or INT4 weights: both, "
               f"and the scales w_gate_up_scale, w_down_scale) and one output, got {len(node.input)} inputs, "
               f"{len(node.output)} outputs")
        return
    names = {role: name for role, name in zip(_QUANTIZED_INPUTS, node.input) if name}
    types = {role: view.elem_type(name) for role, name in names.items()}
    shapes = {role: view.shape(name) for role, name in names.items()}
    hidden = types["hidden"]
    if hidden is not None and hidden not in _KERNEL_DTYPES:
        yield f"hidden is {trt.dtype_name(hidden)}; the fused kernels take BF16 or FP16"
    if types["topk_ids"] not in (None, TensorProto.INT32):
        yield f"topk_ids is {trt.dtype_name(types['topk_ids'])}; the plugin takes INT32 ids"
    if types["topk_weights"] not in (None, TensorProto.FLOAT, hidden):
        yield f"topk_weights is {trt.dtype_name(types['topk_weights'])}; the plugin takes FP32 or hidden's type"
    for role in ("b_gate_up", "b_down") if group_size or fp8 else ("w_gate_up", "w_down", "b_gate_up", "b_down"):
        if role in types and None not in (types[role], hidden) and types[role] != hidden:
            yield f"{role} is {trt.dtype_name(types[role])} but hidden {trt.dtype_name(hidden)}: they must match"
    out_type = view.elem_type(node.output[0])
    if None not in (out_type, hidden) and out_type != hidden:
        yield f"the output is {trt.dtype_name(out_type)} but hidden {trt.dtype_name(hidden)}: they must match"
    if group_size:
        yield from _int4_problems(view, names, shapes, activation, group_size)
        return
    if fp8:
        yield from fp8_weight_problems(view, "w_gate_up", names["w_gate_up"], "w_gate_up_scale",
                                       names["w_gate_up_scale"])
        yield from fp8_weight_problems(view, "w_down", names["w_down"], "w_down_scale", names["w_down_scale"])
    for role, shape in shapes.items():
        if role in _RANKS and shape is not None and len(shape) != _RANKS[role]:
            yield f"{role} has rank {len(shape)}, the plugin needs rank {_RANKS[role]}"
            return
    if activation is not None:
        yield from _size_problems(shapes, is_gated(activation))


def _int4_problems(view: ModelView, names: dict, shapes: dict, activation: str | None, group_size) -> Iterator[str]:
    """The INT4 weights: w_gate_up [E, N1, H] of K = H (hidden's features), w_down [E, H, F] of K = F (N1 = 2F for
    gated activations, else F), each packed with its scales."""
    hidden, gate_up = shapes["hidden"], shapes["w_gate_up"]
    size = hidden[1] if hidden is not None and len(hidden) == 2 else None
    rows = gate_up[1] if gate_up is not None and len(gate_up) == 3 else None
    ffn = rows // 2 if isinstance(rows, int) and activation is not None and is_gated(activation) else rows
    yield from int4_weight_problems(view, "w_gate_up", names["w_gate_up"], "w_gate_up_scale",
                                    names["w_gate_up_scale"], size, group_size)
    yield from int4_weight_problems(view, "w_down", names["w_down"], "w_down_scale", names["w_down_scale"], ffn,
                                    group_size)


def _size_problems(shapes, gated: bool) -> Iterator[str]:
    """Weights and biases of one E, H and F (all static: they are constants)."""
    w_gate_up, w_down = shapes["w_gate_up"], shapes["w_down"]
    if not (w_gate_up and w_down):
        return
    experts, size, ffn = w_down
    rows = 2 * ffn if gated else ffn
    expected = {"w_gate_up": [experts, rows, size], "b_gate_up": [experts, rows], "b_down": [experts, size]}
    for role, want in expected.items():
        got = shapes.get(role)
        if got is not None and any(isinstance(g, int) and g != w for g, w in zip(got, want)):
            yield f"{role} is {got}; with w_down [E, H, F] = {w_down} it must be {want}"
    hidden = shapes["hidden"]
    if hidden and isinstance(hidden[1], int) and hidden[1] != size:
        yield f"hidden has {hidden[1]} features but w_down [E, H, F] = {w_down} has H = {size}"
