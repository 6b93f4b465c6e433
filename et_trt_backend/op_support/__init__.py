"""Which ops the TensorRT lowering supports: one rule module per op family.

This is the one definition shared by the partitioner (what to claim) and the
lowering (what to translate), so the two never disagree:

    unsupported_reason(node) -> str | None   None: the lowering supports node
    SUPPORTED_TARGETS   ATen / dim_order_ops overloads the lowering translates
                        (edge ops resolve to these through their `_op`)
    SYMBOLIC_FUNCTIONS  Python functions on SymInts (shape arithmetic) that may
                        sit inside a partition; the lowering computes them from
                        the tensor shapes
    PRESERVED_OPS       non-core ops kept through edge decomposition
                        (the partitioner's ops_to_not_decompose)
    DATA_MOVEMENT       casts and views: ops that only convert or move data
                        (a partition of nothing else is not worth an engine)
    aten_overload(target)  the ATen overload behind an edge op, by which the
                        rules are keyed (and ops are named to the user)

Every rule also gets the generic checks below: TensorRT tensor dtypes (float64
counts as the float32 it is computed in, where the part's truncate_double is
on) and at most MAX_RANK dimensions on every tensor in and out. And any node, shape
arithmetic and getitem included, whose inputs or output have a size that
depends on the data (an unbacked symbol such as u0: what nonzero, boolean-mask
indexing or unique return, and everything computed from it) stays on
ExecuTorch: a TensorRT engine's sizes must follow from its input shapes, and
torch.onnx cannot export such a graph.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols

from et_trt_backend.tensorrt_limits import MAX_RANK

from . import (
    activation,
    bucketize,
    checks,
    conversion,
    convolution,
    creation,
    elementwise,
    grouped_mm,
    indexing,
    matmul,
    normalization,
    padding,
    pooling,
    reduction,
    resize,
    routing,
    shape,
)
from ._common import (
    TENSOR_DTYPES,
    Rule,
    aten_overload,
    computed_dtype,
    dtype_name,
    holds_float64,
    input_tensors,
    names,
    node_value,
    output_tensors,
)

aten = torch.ops.aten

_FAMILIES = (
    elementwise, activation, reduction, normalization, matmul, convolution, pooling, padding, resize, grouped_mm,
    shape, indexing, routing, bucketize, creation, conversion, checks,
)

RULES: dict[torch._ops.OpOverload, Rule] = {}
for _family in _FAMILIES:
    overlap = RULES.keys() & _family.RULES.keys()
    assert not overlap, f"ops with two rules: {overlap}"
    RULES.update(_family.RULES)

SUPPORTED_TARGETS: frozenset[torch._ops.OpOverload] = frozenset(RULES)

SYMBOLIC_FUNCTIONS = frozenset(
    {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, torch.sym_max, torch.sym_min}
)

DATA_MOVEMENT: frozenset[torch._ops.OpOverload] = conversion.CASTS | shape.VIEWS

# Kept through to_edge's decompositions (each has a rule above):
PRESERVED_OPS: list[torch._ops.OpOverload] = [
    # Not core ATen and no portable kernel: the MoE expert GEMMs themselves.
    aten._grouped_mm.default,
    # torch.argsort(stable=True) would decompose to sort.stable, which is not
    # core ATen and cannot be preserved (ExecuTorch refuses multi-output ops).
    aten.argsort.stable,
    # Not core ATen and no decomposition: expert counts.
    aten.histc.default,
    # Not core ATen and no ExecuTorch kernel: action and value bins.
    aten.bucketize.Tensor,
]


def _generic_reason(node: Node, truncate_double: bool) -> str | None:
    for tensor in input_tensors(node) + output_tensors(node):
        if tensor.dtype == torch.float64 and not truncate_double:
            return ("tensor of dtype float64, which TensorRT lacks; set truncate_double = true in the recipe (the "
                    "default) to compute it in float32, or cast to float32 in the model")
        if computed_dtype(tensor.dtype) not in TENSOR_DTYPES:
            return f"tensor of dtype {dtype_name(tensor.dtype)}; TensorRT tensors are {names(TENSOR_DTYPES)}"
        if tensor.dim() > MAX_RANK:
            return f"tensor of rank {tensor.dim()}; TensorRT supports rank <= {MAX_RANK}"
    return None


def _data_dependent_reason(node: Node) -> str | None:
    values = [("output", node.meta.get("val")), *(("input", a.meta.get("val")) for a in node.all_input_nodes)]
    for what, value in values:
        symbols = free_unbacked_symbols(value)
        if symbols:
            return (
                f"its {what} has a size ({', '.join(sorted(map(str, symbols)))}) that depends on the data (from "
                "nonzero, boolean-mask indexing, unique or the like); a TensorRT engine's sizes must follow from its "
                "input shapes, so this stays on ExecuTorch. To delegate it, keep shapes static: torch.where or "
                "masked_fill instead of a mask index, a fixed-size topk instead of nonzero"
            )
    return None


def unsupported_reason(node: Node, truncate_double: bool = True) -> str | None:
    """None if the TensorRT lowering supports `node`, else why not (and what to do). truncate_double: the
    node's part computes float64 in float32 (CompileOptions.truncate_double)."""
    if node.op != "call_function":
        return None  # placeholders, outputs and attributes are structure, not ops
    target = aten_overload(node.target)
    rule = RULES.get(target)
    data_dependent = _data_dependent_reason(node)
    if data_dependent:
        # The op's own advice, where it has one, says more (bincount: pass minlength=num_experts).
        return routing.BLOCKED_ADVICE.get(target) or _rule_on_data_dependent(rule, node) or data_dependent
    if node.target is operator.getitem:
        return None  # picks one output of a multi-output op; lives with its producer
    if node.target in SYMBOLIC_FUNCTIONS:
        return None
    if rule is None:
        advice = routing.BLOCKED_ADVICE.get(target)
        return advice or f"{target} has no TensorRT lowering"
    return _generic_reason(node, truncate_double) or rule(node)


def _rule_on_data_dependent(rule, node: Node) -> str | None:
    """The rule's refusal of a node with data-dependent sizes, or None where it has none or cannot decide
    (a rule may compare sizes, which an unbacked symbol refuses)."""
    if rule is None:
        return None
    try:
        return rule(node)
    except GuardOnDataDependentSymNode:
        return None


__all__ = [
    "DATA_MOVEMENT", "PRESERVED_OPS", "SUPPORTED_TARGETS", "SYMBOLIC_FUNCTIONS", "aten_overload", "holds_float64",
    "node_value", "unsupported_reason",
]
