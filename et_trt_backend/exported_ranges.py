"""The ranges of dynamic dimensions as the user exported them, carried past ExecuTorch's re-trace.

torch.export keeps what the user asked for: `Dim("batch", min=1, max=8)` is
range_constraints [1, 8]. ExecuTorch's edge re-trace then applies the 0/1
specialization (sizes 0 and 1 are assumed away while tracing) and its program
says [2, 8]; a profile taken from it would refuse batch 1, which robots run.

So the partitioner stamps the user's program (transform_for_pre_decomposition,
the one hook that sees it) before the re-trace: each user input's placeholder
gets the exported range of each dynamic axis under meta["custom"], which
torch's re-traces carry over to the edge program's placeholders.
recipe.dynamic_dims reads it back there.
"""

from __future__ import annotations

import copy

import torch
from torch.export import ExportedProgram

from .program_inputs import user_input_nodes

_KEY = "et_trt_exported_ranges"


def finite_bound(value) -> int | None:
    """A range constraint's bound as an int, None where it is infinite."""
    try:
        return int(value) if value.is_finite else None
    except (AttributeError, TypeError, ValueError):
        return None


def stamp_exported_ranges(program: ExportedProgram) -> ExportedProgram:
    """`program` (a copy: the user's own graph is left as it is) whose user inputs carry the exported
    range [min, max] (max None: unbounded) of each dynamic axis."""
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    stamps = {}
    for node in user_input_nodes(program):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        axes = {axis: [finite_bound(ranges[str(size)].lower), finite_bound(ranges[str(size)].upper)]
                for axis, size in enumerate(value.shape) if str(size) in ranges}
        if axes:
            stamps[node.name] = {str(axis): bounds for axis, bounds in axes.items()}
    if not stamps:
        return program
    graph = copy.deepcopy(program.graph)  # new nodes, each with a shallow copy of its meta
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in stamps:
            node.meta["custom"] = {**node.meta.get("custom", {}), _KEY: stamps[node.name]}
    return program._update(torch.fx.GraphModule(program.graph_module, graph), program.graph_signature)


def exported_range(node: torch.fx.Node, axis: int) -> tuple[int | None, int | None] | None:
    """The exported (min, max) of `node`'s `axis` if `node` is a stamped user input, else None."""
    bounds = node.meta.get("custom", {}).get(_KEY, {}).get(str(axis))
    return tuple(bounds) if bounds is not None else None
