"""TopK: K at most TOPK_MAX_K (TensorRT's top-k layer), sorted outputs.

The MoE router's top-k (K = experts per token) passes; an argsort over all
routed rows (T*k up to 70,000) lowered to TopK does not, unless the rows are
statically few enough.
"""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight.model_view import ModelView, attributes_of, is_standard_op
from et_trt_backend.preflight.violation import Violation
from et_trt_backend.tensorrt_limits import TOPK_MAX_K

RULE = "topk"
_FIX = "rewrite the sort (e.g. a counting sort from one-hot and cumsum over the expert ids)"


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if not is_standard_op(node) or node.op_type != "TopK":
            continue
        attrs = attributes_of(node)
        if attrs.get("sorted", 1) != 1:
            yield Violation.at(RULE, ref, "TopK with sorted=0: TensorRT returns sorted results only (sorted=1)")
        k_name = node.input[1] if len(node.input) > 1 else ""
        if not k_name:  # opset < 10: K is an attribute
            k = attrs.get("k")
        else:
            value = view.value(k_name)
            k = None if value is None else int(value.reshape(-1)[0])
        if k is not None:
            if k > TOPK_MAX_K:
                yield Violation.at(RULE, ref, f"TopK with K={k}: TensorRT's limit is K <= {TOPK_MAX_K}; {_FIX}")
            continue
        # K is computed at run time: safe only if the sorted axis is statically small.
        axis_size = _axis_size(view, node.input[0] if node.input else "", attrs.get("axis", -1))
        if not isinstance(axis_size, int) or axis_size > TOPK_MAX_K:
            size = {None: "unknown size", str: f"dynamic size {axis_size!r}"}.get(
                axis_size if axis_size is None else type(axis_size), f"size {axis_size}")
            yield Violation.at(
                RULE, ref, f"TopK with K computed at run time over an axis of {size}: TensorRT needs "
                f"K <= {TOPK_MAX_K}, which nothing in the model guarantees; {_FIX}",
            )


def _axis_size(view: ModelView, name: str, axis: int) -> int | str | None:
    shape = view.shape(name) if name else None
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    return shape[axis]
