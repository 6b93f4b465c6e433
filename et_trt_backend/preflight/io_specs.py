"""The blob's IO specs must describe the ONNX graph's inputs and outputs: the
runtime binds TensorRT tensors by these names, in the delegate call's order,
and sizes its optimization profiles from these dimensions."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import torch
from onnx import TensorProto

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.violation import Violation
from et_trt_backend.serialization.blob import CheckSpec, TensorSpec

RULE = "io_specs"

_TORCH_TO_ONNX = {
    torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16,
    torch.float64: TensorProto.DOUBLE, torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
    torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8, torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}


def check_io(model: onnx.ModelProto, inputs: list[TensorSpec], outputs: list[TensorSpec],
             checks: Sequence[CheckSpec] = ()) -> list[Violation]:
    """Mismatches between the IO specs and the graph's (non-initializer) inputs and outputs (the partition's
    outputs, then its checks' outputs)."""
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    problems = []
    outputs = [*outputs, *(check.output for check in checks)]
    for kind, specs, values in (("input", inputs, graph_inputs), ("output", outputs, list(model.graph.output))):
        if [s.name for s in specs] != [v.name for v in values]:
            problems.append(Violation(
                RULE, f"(graph {kind}s)", "", f"IO spec {kind}s {[s.name for s in specs]} are not the graph's "
                f"{kind}s {[v.name for v in values]} in order; the runtime binds by these names", ""))
            continue
        for spec, value in zip(specs, values):
            problems += _compare(kind, spec, value)
    return problems


def _compare(kind: str, spec: TensorSpec, value: onnx.ValueInfoProto) -> list[Violation]:
    where = f"(graph {kind} '{spec.name}')"
    tensor_type = value.type.tensor_type
    problems = []
    expected = _TORCH_TO_ONNX.get(spec.dtype)
    if tensor_type.elem_type and expected != tensor_type.elem_type:
        problems.append(Violation(RULE, where, "", f"IO spec says {spec.dtype}, the graph says "
                                  f"{trt.dtype_name(tensor_type.elem_type)}", ""))
    if not tensor_type.HasField("shape"):
        return problems
    dims = tensor_type.shape.dim
    if len(dims) != len(spec.dims):
        return problems + [Violation(RULE, where, "", f"IO spec has rank {len(spec.dims)}, the graph {len(dims)}", "")]
    for axis, (dim, graph_dim) in enumerate(zip(spec.dims, dims)):
        if dim.size is not None and graph_dim.HasField("dim_value") and dim.size != graph_dim.dim_value:
            problems.append(Violation(RULE, where, "", f"axis {axis}: IO spec size {dim.size}, graph size "
                                      f"{graph_dim.dim_value}", ""))
        if dim.size is None and graph_dim.HasField("dim_value"):
            problems.append(Violation(RULE, where, "", f"axis {axis}: dynamic in the IO spec ({dim.name}) but "
                                      f"static ({graph_dim.dim_value}) in the graph", ""))
    return problems
