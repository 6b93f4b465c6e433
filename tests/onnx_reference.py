"""Test helper: runs a partition's ONNX on the CPU without TensorRT, to check it numerically.

onnx's ReferenceEvaluator runs every standard op; `GroupedMM` gets the
implementation below, which follows contract 4 exactly (clamped offsets,
uncovered rows zero, float32 accumulation). `to_float32` makes a float32 twin
of a bf16/fp16 model, so it can be compared with the PyTorch partition run in
float32 (numpy and the reference evaluator have no bf16 arithmetic).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN, GROUPED_MM_OP

_LOW_PRECISION = (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16)


def grouped_mm_reference(a: np.ndarray, b: np.ndarray, offs: np.ndarray, trans_b: int) -> np.ndarray:
    """Contract 4: rows [start_g, end_g) = a @ b[g], end_g = clamp(offs[g], start_g, rows)."""
    rows = a.shape[0]
    weights = np.swapaxes(b, 1, 2) if trans_b else b
    out = np.zeros((rows, weights.shape[2]), dtype=a.dtype)
    start = 0
    for g in range(weights.shape[0]):
        end = min(max(int(offs[g]), start), rows)
        out[start:end] = (a[start:end].astype(np.float32) @ weights[g].astype(np.float32)).astype(a.dtype)
        start = end
    return out


class GroupedMM(OpRun):
    op_domain = GROUPED_MM_DOMAIN

    def _run(self, a, b, offs, trans_b=0, plugin_version=None, plugin_namespace=None):
        return (grouped_mm_reference(a, b, offs, trans_b),)


assert GroupedMM.__name__ == GROUPED_MM_OP


class GatherElements(OpRun):
    """ONNX GatherElements via np.take_along_axis. onnx 1.23's reference version goes through
    np.choose, which takes at most 64 entries along the axis (the counting sort gathers along
    the expert axis)."""

    def _run(self, data, indices, axis=0):
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[GroupedMM, GatherElements])


def to_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every bf16/fp16 tensor, cast and IO type made float32."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph

    def upcast_tensor(tensor: onnx.TensorProto) -> None:
        if tensor.data_type in _LOW_PRECISION:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))

    for tensor in graph.initializer:
        upcast_tensor(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type in ("Cast", "EyeLike", "RandomNormal") and attr.name in ("to", "dtype") \
                    and attr.i in _LOW_PRECISION:
                attr.i = onnx.TensorProto.FLOAT
            if attr.type == onnx.AttributeProto.TENSOR:
                upcast_tensor(attr.t)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type in _LOW_PRECISION:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model
