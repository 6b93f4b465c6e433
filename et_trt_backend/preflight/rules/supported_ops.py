"""Every node must be an operator TensorRT's parser supports, or one of our plugin ops (GroupedMM, MoEExperts)."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN, GROUPED_MM_OP, MOE_EXPERTS_OP
from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, is_standard_op
from et_trt_backend.preflight.violation import Violation

RULE = "supported_ops"


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if is_standard_op(node):
            if node.op_type in trt.SUPPORTED_OPS:
                continue
            if node.op_type in trt.UNSUPPORTED_OPS:
                why = f"TensorRT's ONNX parser does not support {node.op_type}"
            else:
                why = f"{node.op_type} is not in TensorRT's ONNX operator list"
            yield Violation.at(
                RULE, ref, f"{why} ({trt.FACTS_FROM}); rewrite it in supported ops or keep it out of the partition"
            )
        elif node.domain != GROUPED_MM_DOMAIN or node.op_type not in (GROUPED_MM_OP, MOE_EXPERTS_OP):
            yield Violation.at(
                RULE, ref,
                f"custom op {node.domain}::{node.op_type} has no TensorRT plugin in et-trt (only "
                f"{GROUPED_MM_DOMAIN}::{GROUPED_MM_OP} and {GROUPED_MM_DOMAIN}::{MOE_EXPERTS_OP}); lower it to "
                "standard ONNX ops",
            )
