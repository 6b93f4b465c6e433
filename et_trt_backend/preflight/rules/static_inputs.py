"""Inputs the parser needs at build time (axes, depth, ...) must be initializers or Constants."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, is_standard_op
from et_trt_backend.preflight.violation import Violation

RULE = "static_inputs"


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if not is_standard_op(node):
            continue
        for index, what in trt.STATIC_INPUTS.get(node.op_type, []):
            name = node.input[index] if index < len(node.input) else ""
            if name and not view.is_constant(name):
                yield Violation.at(
                    RULE, ref, f"{node.op_type}'s `{what}` input '{name}' is computed at run time; TensorRT needs "
                    "it as an initializer (a constant in the model): make it a Python constant in the source",
                )
        if node.op_type == "Dropout" and len(node.input) > 2 and view.is_constant(node.input[2]):
            if bool(view.value(node.input[2]).any()):
                yield Violation.at(RULE, ref, "Dropout in training mode: TensorRT runs inference only; call eval()")
        for index, what in trt.STATIC_SHAPE_INPUTS.get(node.op_type, []):
            name = node.input[index] if index < len(node.input) else ""
            shape = view.shape(name) if name else None
            if shape is not None and not all(isinstance(d, int) for d in shape):
                yield Violation.at(
                    RULE, ref, f"{node.op_type}'s `{what}` has a dynamic shape {shape}; TensorRT needs it static",
                )
