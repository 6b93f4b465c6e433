"""Recognising MoE blocks in an edge graph.

A MoE block is found from its grouped GEMMs: `aten._grouped_mm` calls that
share one `offs` tensor belong to one block. Walking back from `offs`
(cumsum <- counts <- expert ids) reaches the router's top-k (or max/argmax
for top-1 routers). The block is the innermost module that holds both the
router and the experts, e.g. "decoder.layers.0.moe" (the SparseMoeBlock in
transformers models), and its region is every node created inside that
module: router linear, scoring, top-k, sort, counts, offsets, gathers, both
GEMMs, the activation, shared experts and the weighted combine. The region
must be delegated whole.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Graph, Node

from et_trt_backend.module_paths import common_prefix, module_path
from et_trt_backend.op_support import aten_overload
from et_trt_backend.op_support.routing import ROUTER_OPS

aten = torch.ops.aten


@dataclasses.dataclass
class MoEBlock:
    module: str  # innermost module holding router and experts ("" = the exported module itself)
    grouped_mms: list[Node]
    routers: list[Node]
    nodes: set[Node]  # the region that must stay in one delegate


def _inside(path: str | None, module: str) -> bool:
    if path is None:
        return False
    return module == "" or path == module or path.startswith(module + ".")


def _routers_behind(offs: Node) -> list[Node]:
    """Router ops reached walking back from a grouped GEMM's offs (each ancestor visited once)."""
    seen, frontier, found = set(), [offs], []
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_function" and aten_overload(node.target) in ROUTER_OPS:
            found.append(node)
            continue  # the router is the far end of the routing path
        frontier.extend(node.all_input_nodes)
    return found


def find_moe_blocks(graph: Graph) -> list[MoEBlock]:
    by_offs: dict[Node, list[Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and aten_overload(node.target) is aten._grouped_mm.default:
            offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
            by_offs.setdefault(offs, []).append(node)

    blocks = []
    for offs, gemms in by_offs.items():
        routers = _routers_behind(offs) if isinstance(offs, Node) else []
        paths = [module_path(n) for n in gemms + routers]
        module = common_prefix(p for p in paths if p is not None)
        nodes = {n for n in graph.nodes if n.op == "call_function" and _inside(module_path(n), module)}
        nodes.update(gemms + routers)
        blocks.append(MoEBlock(module, gemms, routers, nodes))
    return _merge_overlapping(blocks)


def _merge_overlapping(blocks: list[MoEBlock]) -> list[MoEBlock]:
    """Blocks whose regions overlap (e.g. both GEMM pairs of one module) are one block."""
    merged: list[MoEBlock] = []
    for block in blocks:
        for other in merged:
            if other.nodes & block.nodes:
                other.grouped_mms += block.grouped_mms
                other.routers += block.routers
                other.nodes |= block.nodes
                other.module = common_prefix([other.module, block.module])
                break
        else:
            merged.append(block)
    return merged
