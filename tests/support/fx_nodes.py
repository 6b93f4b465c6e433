"""fx nodes for op support rules: a node calling an op on meta tensors, without exporting anything."""

from __future__ import annotations

import torch
from torch.fx import Graph


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def call(target, *args, out=None, **kwargs):
    """An fx node calling `target`; tensor args become placeholders carrying meta tensors."""
    graph = Graph()

    def arg(a):
        if isinstance(a, torch.Tensor):
            node = graph.placeholder(f"x{len(graph.nodes)}")
            node.meta["val"] = a
            return node
        if isinstance(a, list):
            return [arg(x) for x in a]
        return a

    node = graph.call_function(target, tuple(arg(a) for a in args), kwargs)
    if out is not None:
        node.meta["val"] = out
    return node
