"""Errors the partitioner raises, and how they point at the user's code."""

from __future__ import annotations

from torch.fx import Node


class PartitionError(RuntimeError):
    """The program cannot be partitioned as asked; the message names the op, its source and the fix."""


def source_line(node: Node) -> str:
    """The user's source line that created `node` (last frame of its stack trace)."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File ")]
    if not frames:
        return "source line unknown (no stack trace in the node's metadata)"
    code = trace[-1].strip() if not trace[-1].strip().startswith("File ") else ""
    return f"{frames[-1]}{': ' + code if code else ''}"
