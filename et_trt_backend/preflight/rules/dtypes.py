"""Each op's data type must be one TensorRT supports for that op (bf16 per op);
network inputs and outputs must have types TensorRT can bind."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, is_standard_op
from et_trt_backend.preflight.violation import Violation

RULE = "dtypes"


def check(view: ModelView) -> Iterator[Violation]:
    yield from _network_io(view)
    for ref in view:
        node = ref.node
        allowed = trt.SUPPORTED_OPS.get(node.op_type)
        if not is_standard_op(node) or allowed is None or node.op_type in trt.DTYPE_EXEMPT:
            continue  # unsupported ops are the supported_ops rule's
        if node.op_type in trt.DTYPE_BOTH_ENDS:
            tensors = [("input", node.input[0] if node.input else ""), ("output", node.output[0])]
        else:
            side, index = trt.DTYPE_TENSOR.get(node.op_type, ("in", 0))
            names = node.input if side == "in" else node.output
            tensors = [("input" if side == "in" else "output", names[index] if index < len(names) else "")]
        for what, name in tensors:
            elem_type = view.elem_type(name) if name else None
            if elem_type is None:
                continue  # type unknown: nothing to check
            dtype = trt.dtype_name(elem_type)
            if dtype not in allowed:
                yield Violation.at(
                    RULE, ref,
                    f"{node.op_type} on {dtype} ({what} '{name}') is not supported by TensorRT; it takes "
                    f"{', '.join(sorted(allowed))}. Cast to one of those around this op"
                    + (" (TensorRT has no BF16 for it)" if dtype == "BF16" else ""),
                )


def _network_io(view: ModelView) -> Iterator[Violation]:
    graph = view.model.graph
    constants = {init.name for init in graph.initializer}
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            if value.name in constants or not value.type.tensor_type.elem_type:
                continue
            dtype = trt.dtype_name(value.type.tensor_type.elem_type)
            if dtype not in trt.NETWORK_IO_DTYPES:
                yield Violation(
                    RULE, f"(graph {kind} '{value.name}')", "", f"network {kind} of type {dtype}: TensorRT "
                    f"binds only {', '.join(sorted(trt.NETWORK_IO_DTYPES))}; cast it at the partition boundary", "",
                )
