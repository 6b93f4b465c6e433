"""Integer (SymInt) partition inputs -> sizes read from the partition's tensors.

When two partitions both need a dynamic size (e.g. the token count of a MoE
stack split by an op that stays in ExecuTorch), ExecuTorch computes it once
and passes it to each delegate as an integer argument. A TensorRT engine takes
tensors only, so the lowering drops such an input and recomputes each of its
uses as `aten.sym_size.int(tensor_input, axis)` of a tensor input that has
that size as a dimension (ONNX: Shape -> Gather). The blob's inputs then list
the delegate's tensor arguments only; the runtime skips integer arguments.
"""

from __future__ import annotations

import logging
from typing import Iterable

import torch
from torch.utils import _pytree as pytree

from et_trt_backend.program_inputs import user_input_nodes

from .errors import LoweringError

logger = logging.getLogger(__name__)


def carrier(nodes: Iterable[torch.fx.Node], size: torch.SymInt) -> tuple[torch.fx.Node, int] | None:
    """The first of `nodes` that is a tensor with `size` as a dimension, and that axis. The partitioner asks
    it of a partition's tensor inputs, so it never hands the lowering a size this cannot recompute."""
    for node in nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, torch.SymInt) and dim.node.expr == size.node.expr:
                return node, axis
    return None


def _drop_call_inputs(program: torch.export.ExportedProgram, dropped: set[str]) -> None:
    """Removes the dropped inputs from the program's call signature (its input pytree spec)."""
    positions = {i for i, name in enumerate(program.graph_signature.user_inputs) if name in dropped}
    for entry in program.module_call_graph:
        signature = entry.signature
        if entry.fqn != "" or signature is None:
            continue
        args, kwargs = pytree.tree_unflatten(list(range(signature.in_spec.num_leaves)), signature.in_spec)
        if kwargs or any(not isinstance(a, int) for a in args):
            raise LoweringError("a partition whose inputs are nested or keyword arguments cannot drop its "
                                f"integer inputs {sorted(dropped)}; expected flat positional inputs")
        signature.in_spec = pytree.tree_flatten((tuple(a for a in args if a not in positions), {}))[1]
        signature.inputs = [a for a in signature.inputs if getattr(a, "name", None) not in dropped]
        if signature.forward_arg_names is not None and len(signature.forward_arg_names) == len(args):
            signature.forward_arg_names = [n for i, n in enumerate(signature.forward_arg_names)
                                           if i not in positions]


def inline_size_inputs(program: torch.export.ExportedProgram) -> None:
    """Replaces every SymInt user input of `program` (in place) by the size of a tensor input."""
    graph = program.graph
    size_inputs = [n for n in user_input_nodes(program) if isinstance(n.meta.get("val"), torch.SymInt)]
    if not size_inputs:
        return
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    for node in size_inputs:
        size = node.meta["val"]
        found = carrier(user_input_nodes(program), size)
        if found is None:
            tensors = [n.name for n in user_input_nodes(program) if isinstance(n.meta.get("val"), torch.Tensor)]
            raise LoweringError(
                f"partition input '{node.name}' is an integer ({size}) that no tensor input of the partition "
                f"has as a dimension (tensor inputs: {tensors or 'none'}); a TensorRT engine takes tensors "
                "only and cannot recompute it (TensorRTPartitioner leaves the ops that read such a size to "
                "ExecuTorch; the tensors they make carry it)"
            )
        tensor, axis = found
        with graph.inserting_before(first_op):
            recomputed = graph.call_function(torch.ops.aten.sym_size.int, (tensor, axis))
        recomputed.meta["val"] = tensor.meta["val"].shape[axis]
        node.replace_all_uses_with(recomputed)
        logger.info("partition input '%s' (%s) is recomputed as the size of '%s' along axis %d",
                    node.name, size, tensor.name, axis)
        graph.erase_node(node)
    dropped = {n.name for n in size_inputs}
    _drop_call_inputs(program, dropped)
    program.graph_signature.input_specs[:] = [
        spec for spec in program.graph_signature.input_specs
        if not (spec.arg is not None and getattr(spec.arg, "name", None) in dropped)]
    program.graph_module.recompile()
