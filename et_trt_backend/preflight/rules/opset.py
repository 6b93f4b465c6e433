"""The model's ONNX opset must be one the parser imports; custom domains must be declared."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN
from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView
from et_trt_backend.preflight.violation import Violation

RULE = "opset"


def check(view: ModelView) -> Iterator[Violation]:
    version = view.opsets.get("ai.onnx")
    if version is None:
        yield Violation(RULE, "(model)", "", "the model imports no default-domain opset", "")
    elif not trt.MIN_OPSET <= version <= trt.MAX_OPSET:
        yield Violation(
            RULE, "(model)", "",
            f"opset {version} is outside the {trt.MIN_OPSET}-{trt.MAX_OPSET} TensorRT's parser imports "
            f"({trt.FACTS_FROM}); export with opset {trt.MAX_OPSET} or lower",
            "",
        )
    if GROUPED_MM_DOMAIN not in view.opsets and any(
        ref.node.domain == GROUPED_MM_DOMAIN for ref in view
    ):
        yield Violation(
            RULE, "(model)", "",
            f"nodes use domain '{GROUPED_MM_DOMAIN}' but the model does not import it (opset_import)", "",
        )
