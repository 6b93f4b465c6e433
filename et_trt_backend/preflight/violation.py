"""One finding of the pre-flight check."""

from __future__ import annotations

import dataclasses

from et_trt_backend.preflight.model_view import NodeRef, is_standard_op, source_of


@dataclasses.dataclass(frozen=True)
class Violation:
    rule: str     # the rule module's name, e.g. "topk"
    node: str     # the ONNX node, e.g. "'/decoder/TopK_3'" (graph path added for subgraphs)
    op_type: str  # "domain::op" for custom domains
    message: str  # what TensorRT does not accept, and how to fix it
    source: str   # PyTorch source line "file:line (function): code", "" if unknown

    @classmethod
    def at(cls, rule: str, ref: NodeRef, message: str) -> "Violation":
        node = ref.node
        op_type = node.op_type if is_standard_op(node) else f"{node.domain}::{node.op_type}"
        return cls(rule, ref.label, op_type, message, source_of(node))

    def __str__(self) -> str:
        where = f"\n    from {self.source}" if self.source else "\n    (no PyTorch source recorded for this node)"
        return f"[{self.rule}] {self.op_type} node {self.node}: {self.message}{where}"
