"""Scatter reductions: ScatterND takes no `reduction` attribute at all in TensorRT's
parser (not even "none"); ScatterElements with a reduction is no TensorRT layer
(the parser hands it to the ScatterElements plugin of libnvinfer_plugin, which
the et-trt runtime does not load)."""

from __future__ import annotations

from collections.abc import Iterator

from et_trt_backend.preflight.model_view import ModelView, attributes_of, is_standard_op
from et_trt_backend.preflight.violation import Violation

RULE = "scatter"
_FIX = ("combine with a reduction-free form (e.g. sort rows by destination and sum segments, or a one-hot "
        "matmul) instead of index_add / index_put(accumulate=True)")


def check(view: ModelView) -> Iterator[Violation]:
    for ref in view:
        node = ref.node
        if not is_standard_op(node):
            continue
        attrs = attributes_of(node)
        reduction = attrs.get("reduction")
        if node.op_type == "ScatterND" and reduction == b"none":
            yield Violation.at(
                RULE, ref, "ScatterND with reduction='none' written out: TensorRT's parser refuses the `reduction` "
                "attribute even when it is 'none'; omit it",
            )
        elif node.op_type == "ScatterND" and reduction is not None:
            yield Violation.at(
                RULE, ref, f"ScatterND with reduction={reduction.decode()!r}: TensorRT's parser refuses the "
                f"`reduction` attribute; {_FIX}",
            )
        if node.op_type == "ScatterElements" and reduction not in (None, b"none"):
            yield Violation.at(
                RULE, ref, f"ScatterElements with reduction={reduction.decode()!r} is not a TensorRT layer (it "
                f"needs TensorRT's plugin library, which et-trt does not load); {_FIX}",
            )
