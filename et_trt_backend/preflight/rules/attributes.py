"""Attribute values and optional outputs the parser does not accept (Resize modes,
pooling dilations, LSTM layout, Constant kinds, extra outputs, zero points)."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, attributes_of, is_standard_op
from et_trt_backend.preflight.violation import Violation

RULE = "attributes"


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if not is_standard_op(node):
            continue
        attrs = attributes_of(node)
        for (op, name), (allowed, default) in trt.ATTRIBUTE_VALUES.items():
            if op == node.op_type:
                value = attrs.get(name, default)
                if value not in allowed:
                    yield Violation.at(
                        RULE, ref, f"{op} with {name}={_show(value)}: TensorRT accepts only "
                        f"{', '.join(sorted(_show(v) for v in allowed))}",
                    )
        for op, name in trt.ONES_ATTRIBUTES:
            if op == node.op_type and any(d != 1 for d in attrs.get(name, [])):
                yield Violation.at(RULE, ref, f"{op} with {name}={list(attrs[name])}: TensorRT needs all ones")
        if node.op_type == "Constant":
            for name in sorted(trt.UNSUPPORTED_CONSTANT_ATTRIBUTES & set(attrs)):
                yield Violation.at(RULE, ref, f"Constant with `{name}`: TensorRT reads only dense numeric constants")
        if node.op_type in trt.FIRST_OUTPUT_ONLY:
            extra = [name for name in node.output[1:] if name]
            if extra:
                yield Violation.at(
                    RULE, ref, f"{node.op_type} outputs {extra} beyond the first: TensorRT supports only the "
                    "first output; do not use the others",
                )
        zero_point = trt.ZERO_POINT_INPUTS.get(node.op_type)
        if zero_point is not None and zero_point < len(node.input) and node.input[zero_point]:
            value = view.value(node.input[zero_point])
            if value is None or value.any():
                yield Violation.at(RULE, ref, f"{node.op_type} needs a constant zero point of 0 in TensorRT")


def _show(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else repr(value)
