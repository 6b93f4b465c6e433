"""Data-dependent output sizes (NonZero, NonMaxSuppression) must not reach the
partition's outputs.

TensorRT accepts these ops and sizes their results while the engine runs, but
the et-trt runtime sizes each output from the input shapes before it runs
(the runtime refuses data-dependent output shapes). Inside the engine they are
fine as long as what leaves it has a size that follows from the input shapes.
Ops with data-dependent sizes that TensorRT lacks altogether (Unique, Compress)
are reported by the supported_ops rule.
"""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.preflight.model_view import ModelView, is_standard_op, NodeRef
from et_trt_backend.preflight.violation import Violation

RULE = "data_dependent"


def check(view: ModelView) -> Iterator[Violation]:
    graph = view.model.graph
    consumers: dict[str, list[NodeRef]] = {}
    for ref in view:
        if ref.graph == "main":
            for name in ref.node.input:
                consumers.setdefault(name, []).append(ref)
    input_dims = {d for v in graph.input for d in (view.shape(v.name) or []) if isinstance(d, str)}
    for ref in view:
        node = ref.node
        if not is_standard_op(node) or node.op_type not in trt.DATA_DEPENDENT_OPS or ref.graph != "main":
            continue
        reached = _downstream(list(node.output), consumers)
        for output in graph.output:
            if output.name in reached and not _sized_by_inputs(view.shape(output.name), input_dims):
                yield Violation.at(
                    RULE, ref, f"{node.op_type}'s data-dependent size reaches the partition output "
                    f"'{output.name}' (shape {view.shape(output.name)}); et-trt sizes outputs from the input "
                    "shapes: use a fixed-size form (a mask with where/cumsum instead of nonzero, boolean "
                    "indexing or masked_select)",
                )


def _downstream(names: list[str], consumers: dict[str, list[NodeRef]]) -> set[str]:
    seen, todo = set(names), list(names)
    while todo:
        for ref in consumers.get(todo.pop(), []):
            for out in ref.node.output:
                if out and out not in seen:
                    seen.add(out)
                    todo.append(out)
    return seen


def _sized_by_inputs(shape: list[int | str | None] | None, input_dims: set[str]) -> bool:
    return shape is not None and all(isinstance(d, int) or d in input_dims for d in shape)
