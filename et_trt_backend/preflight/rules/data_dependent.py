"""Ops whose output size depends on the data (NonZero, NonMaxSuppression).

TensorRT's parser accepts them as data-dependent-shape layers, but an engine
with such a tensor cannot size it before running and loses the static
planning the delegate relies on; et-trt wants every shape to follow from the
input shapes. (Unique, Compress and similar are not supported at all: the
supported_ops rule reports them.)"""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView
from et_trt_backend.preflight.violation import Violation

RULE = "data_dependent"


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if node.domain in ("", "ai.onnx") and node.op_type in trt.DATA_DEPENDENT_OPS:
            yield Violation.at(
                RULE, ref, f"{node.op_type}'s output size depends on the input values; use a fixed-size form "
                "(e.g. a mask with where/cumsum instead of nonzero, boolean indexing or masked_select)",
            )
