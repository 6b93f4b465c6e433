"""What an export gave TensorRT and what it left to ExecuTorch, per program, each op left out with its reason.

TensorRTPartitioner logs the ops it leaves out at WARNING (so a plain Python export shows them);
`report(edge)` gives the same for a lowered program, with the partition
and op counts. The reason is the op's support rule's (op_support.unsupported_reason); the source line
is the user's (source_lines.py).
"""

from __future__ import annotations

import collections
import dataclasses

import torch
from torch.fx import Node

from et_trt_backend import BACKEND_ID, op_support
from et_trt_backend.source_lines import source_line

# The reason for a supported op that no TensorRT partition holds.
NOT_CLAIMED = "supported, but no TensorRT partition holds it"
# Node meta key under which TensorRTPartitioner keeps its verdict on an op it leaves out: the verdict depends on
# the op's recipe part (truncate_double), which the graph alone does not say.
REASON_META = "et_trt_unsupported_reason"


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """Ops of one kind, from one source line, that run outside TensorRT (in ExecuTorch's kernels)."""

    op: str  # the ATen overload, e.g. "aten.constant_pad_nd.default"
    source: str  # the user's line: "file:line (function): code"
    reason: str  # why TensorRT does not run it, and what to do instead where the rule says
    count: int = 1

    def __str__(self) -> str:
        return f"{self.op}{f' (x{self.count})' if self.count > 1 else ''} at {self.source}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """One program (method) of an export."""

    method: str
    partitions: int  # TensorRT partitions (delegates)
    ops_delegated: int  # ops inside them
    left_out: list[LeftOut]
    other_delegates: dict[str, int]  # other backends' delegates, by backend id

    def __str__(self) -> str:
        others = "".join(f", {n} {backend} delegate(s)" for backend, n in self.other_delegates.items())
        head = f"program {self.method!r}: {self.partitions} TensorRT partition(s) of {self.ops_delegated} ops{others}; "
        return head + (describe(self.left_out) if self.left_out else "no op left to ExecuTorch")


def describe(entries: list[LeftOut]) -> str:
    """"N op(s) left to ExecuTorch:" and a line per entry."""
    return f"{sum(e.count for e in entries)} op(s) left to ExecuTorch, outside TensorRT:\n" + "\n".join(
        f"  {entry}" for entry in entries)


def is_op(node: Node) -> bool:
    """Whether `node` computes something (an ATen or edge op), as opposed to structure or shape arithmetic."""
    return (node.op == "call_function" and node.target is not torch.ops.aten.sym_size.int
            and isinstance(op_support.aten_overload(node.target), torch._ops.OpOverload))


def left_out(nodes: list[Node]) -> list[LeftOut]:
    """The ops among `nodes` (in graph order) grouped by op, source line and reason, first occurrence first."""
    counts = collections.Counter(
        (str(op_support.aten_overload(n.target)), source_line(n), _reason(n)) for n in nodes if is_op(n))
    return [LeftOut(op, source, reason, count) for (op, source, reason), count in counts.items()]


def _reason(node: Node) -> str:
    """The partitioner's verdict on `node` where it left one, else the support rule's with the default options."""
    return node.meta.get(REASON_META) or op_support.unsupported_reason(node) or NOT_CLAIMED


def report(edge) -> list[ProgramReport]:
    """Per program of a lowered EdgeProgramManager (`to_edge_transform_and_lower`'s result): its TensorRT
    partitions, the ops in them, and the ops left to ExecuTorch with their reasons and source lines. Call it
    before `edge.to_executorch()`, which turns the ops into their out variants."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    reports = []
    for method in sorted(edge.methods):
        graph_module = edge.exported_program(method).graph_module
        ours, others = [], collections.Counter()
        for _, module, _ in get_lowered_submodules(graph_module):
            if module.backend_id == BACKEND_ID:
                ours.append(module)
            else:
                others[module.backend_id] += 1
        delegated = sum(is_op(n) for m in ours for n in m.original_module.graph.nodes)
        reports.append(ProgramReport(method, len(ours), delegated, left_out(list(graph_module.graph.nodes)),
                                     dict(others)))
    return reports
