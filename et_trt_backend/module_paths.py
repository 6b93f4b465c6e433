"""Which module of the user's model an fx node came from: torch.export records the module stack per node
(`node.meta["nn_module_stack"]`); the partitioner names MoE blocks and parts by these paths, the lowering its
MoE blocks."""

from __future__ import annotations

from collections.abc import Iterable

from torch.fx import Node


def module_path(node: Node) -> str | None:
    """Path of the innermost module that created `node` ("" for the root), None if unknown."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return path


def common_prefix(paths: Iterable[str]) -> str:
    """The innermost module holding every one of `paths` ("" for the root)."""
    split = [p.split(".") if p else [] for p in paths]
    common = []
    for segments in zip(*split):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return ".".join(common)
