"""The pre-flight rules, one module per TensorRT limit. Each module exposes
`check(view: ModelView) -> Iterator[Violation]`."""

from et_trt_backend.preflight.rules import (
    attributes,
    data_dependent,
    dtypes,
    graph_order,
    grouped_mm,
    moe_experts,
    opset,
    scatter,
    static_inputs,
    supported_ops,
    topk,
)

RULES = {
    "graph_order": graph_order.check,
    "opset": opset.check,
    "supported_ops": supported_ops.check,
    "dtypes": dtypes.check,
    "static_inputs": static_inputs.check,
    "attributes": attributes.check,
    "topk": topk.check,
    "scatter": scatter.check,
    "data_dependent": data_dependent.check,
    "grouped_mm": grouped_mm.check,
    "moe_experts": moe_experts.check,
}
