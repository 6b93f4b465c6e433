"""Edge dialect -> ATen: the form the PyTorch ONNX exporter translates.

Edge programs wrap every ATen overload in an EdgeOpOverload, replace views by
their `*_copy` forms and casts/clones by ExecuTorch's dim-order ops. This maps
each back to the ATen overload it stands for, on a copy of the graph and of its
weight tables (the edge program passed to preprocess is left as it is, whatever
later passes change).

Memory layout: every edge tensor is contiguous (a `*_copy` op returns a fresh
tensor), while the ATen view ops they map to return strided views. So the
mapping keeps what the edge ops mean, not their names alone: `view_copy`
becomes `reshape` (a view of a permuted or expanded tensor is not always
possible, its reshape always is, with the same values), and the dim-order
clone and cast produce contiguous tensors (`memory_format=contiguous_format`),
as their dim order says. ONNX tensors have no strides, so none of this changes
a value; it keeps the exporter's re-trace from refusing a view.
"""

from __future__ import annotations

import copy
import itertools
import logging

import torch
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from torch._export.verifier import Verifier
from torch.export.graph_signature import InputKind

logger = logging.getLogger(__name__)

_DIM_ORDER_OPS = {
    "dim_order_ops::_to_dim_order_copy": torch.ops.aten._to_copy.default,
    "dim_order_ops::_clone_dim_order": torch.ops.aten.clone.default,
}
# Edge copies whose ATen view form needs a layout the copy does not promise.
_LAYOUT_FREE_FORMS = {torch.ops.aten.view_copy.default: torch.ops.aten.reshape.default}


def _view_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """aten.X_copy.overload -> aten.X.overload when that view op exists."""
    packet = op.name().split("::")[1].split(".")[0]
    if op.namespace != "aten" or not packet.endswith("_copy"):
        return op
    view_packet = getattr(torch.ops.aten, packet[: -len("_copy")], None)
    if view_packet is None or op._overloadname not in view_packet.overloads():
        return op
    return getattr(view_packet, op._overloadname)


def aten_target(target):
    """The ATen overload (or unchanged callable) an edge-graph target stands for."""
    if isinstance(target, EdgeOpOverload):
        target = target._op
    if isinstance(target, torch._ops.OpOverload):
        name = target.name().split(".")[0]
        if name in _DIM_ORDER_OPS:
            return _DIM_ORDER_OPS[name]
        return _LAYOUT_FREE_FORMS.get(target) or _view_form(target)
    return target


def _dim_order_to_memory_format(node: torch.fx.Node) -> None:
    """dim_order kwarg -> memory_format=contiguous_format (clone and _to_copy take no dim_order).

    et-trt tensors are contiguous (TensorRT's linear format), so any other dim
    order is refused rather than ignored. clone takes no non_blocking either
    (a copy on one device: it changes nothing).
    """
    dim_order = node.kwargs.get("dim_order")
    if dim_order is not None and list(dim_order) != sorted(dim_order):
        raise ValueError(
            f"node {node.name}: non-contiguous dim_order {list(dim_order)} is not supported; "
            "export the model with contiguous tensors"
        )
    dropped = ("dim_order", "non_blocking") if node.target is torch.ops.aten.clone.default else ("dim_order",)
    node.kwargs = {**{k: v for k, v in node.kwargs.items() if k not in dropped},
                   "memory_format": torch.contiguous_format}


def to_aten_program(edge_program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of `edge_program` whose graph calls ATen overloads only.

    A plain torch.export program is accepted too; it may hold in-place ops
    (index_add_, index_put_), so it is functionalized first.
    """
    if not any(isinstance(n.target, EdgeOpOverload) for n in edge_program.graph.nodes):
        edge_program = edge_program.run_decompositions({})
    gm = copy.deepcopy(edge_program.graph_module)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        op = node.target._op if isinstance(node.target, EdgeOpOverload) else node.target
        node.target = aten_target(node.target)
        if isinstance(op, torch._ops.OpOverload) and op.name().split(".")[0] in _DIM_ORDER_OPS:
            _dim_order_to_memory_format(node)
    gm.recompile()
    signature = copy.deepcopy(edge_program.graph_signature)
    return torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=dict(edge_program.state_dict),
        range_constraints=edge_program.range_constraints,
        module_call_graph=copy.deepcopy(edge_program.module_call_graph),
        constants=_one_target_per_constant(signature, edge_program.constants),
        verifiers=[Verifier],
    )


def _one_target_per_constant(signature, constants: dict) -> dict:
    """The constants table, each lifted constant placeholder given a target of its own.

    ExecuTorch hands a partition a copy of a constant that several partitions use
    (placeholder `c_x_copy_0` beside `c_x`, both naming the target `x`); PyTorch's
    unlifting, which the ONNX exporter runs, then fails ("`x` is not a buffer").
    Each repeat of a target becomes `<target>_copy_<n>` in `signature` (changed in place)."""
    constants = dict(constants)
    seen = set()
    for spec in signature.input_specs:
        if spec.kind is not InputKind.CONSTANT_TENSOR:
            continue
        if spec.target in seen:
            target = next(name for n in itertools.count()
                          if (name := f"{spec.target}_copy_{n}") not in constants)
            constants[target] = constants[spec.target]
            spec.target = target
        seen.add(spec.target)
    return constants
