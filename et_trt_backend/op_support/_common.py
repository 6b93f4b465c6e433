"""Shared helpers for the per-family op support rules.

A rule takes an fx node whose target is one ATen overload and returns None when
the TensorRT lowering handles that node, else a short reason that tells the
user what is wrong and, where one exists, what to do instead. Rules read the
node's `meta["val"]` (fake tensors from torch.export), so they see dtypes and
symbolic shapes; they never run the op.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from executorch.exir.dialects.edge._ops import EdgeOpOverload
from torch.fx import Node

Rule = Callable[[Node], "str | None"]

FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
INT_DTYPES = frozenset({torch.int32, torch.int64})
INDEX_DTYPES = INT_DTYPES
BOOL_DTYPES = frozenset({torch.bool})
NUMERIC_DTYPES = FLOAT_DTYPES | INT_DTYPES
# Every dtype a TensorRT network tensor may have in our lowering.
TENSOR_DTYPES = NUMERIC_DTYPES | BOOL_DTYPES


def aten_overload(target: Any) -> Any:
    """The ATen (or dim_order_ops) overload behind an edge op; other targets unchanged."""
    if isinstance(target, EdgeOpOverload):
        return target._op
    return target


def fake_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors in a node's meta value (a tensor, or a tuple/list of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def output_tensors(node: Node) -> list[torch.Tensor]:
    return fake_tensors(node.meta.get("val"))


def arg_tensor(node: Node, index: int) -> torch.Tensor | None:
    """The fake tensor of positional argument `index`, if that argument is a tensor node."""
    if index >= len(node.args):
        return None
    arg = node.args[index]
    if isinstance(arg, Node):
        val = arg.meta.get("val")
        return val if isinstance(val, torch.Tensor) else None
    return None


def input_tensors(node: Node) -> list[torch.Tensor]:
    """Fake tensors of every tensor argument (also inside lists, e.g. cat's inputs)."""
    found = []

    def visit(arg: Any) -> None:
        if isinstance(arg, Node):
            found.extend(fake_tensors(arg.meta.get("val")))
        elif isinstance(arg, (list, tuple)):
            for a in arg:
                visit(a)

    for arg in list(node.args) + list(node.kwargs.values()):
        visit(arg)
    return found


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(sorted(dtype_name(d) for d in dtypes))


def node_value(node: Any) -> Any:
    """The value torch.export left on an fx node (meta["val"]: a fake tensor, a SymInt, a tuple of them), None for
    anything else (a constant argument, a node without one)."""
    return node.meta.get("val") if isinstance(node, Node) else None


def holds_float64(node: Any) -> bool:
    """Whether `node` (an fx node) computes a float64 tensor."""
    value = node_value(node)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float64


def computed_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the lowering computes `dtype` in: float64 in float32 (CompileOptions.truncate_double, which
    op_support.unsupported_reason checks; the rules take float64 where they take float32)."""
    return torch.float32 if dtype == torch.float64 else dtype


def check_dtype(tensor: torch.Tensor | None, allowed: frozenset[torch.dtype], what: str) -> str | None:
    if tensor is not None and computed_dtype(tensor.dtype) not in allowed:
        return f"{what} has dtype {dtype_name(tensor.dtype)}; supported: {names(allowed)}"
    return None


def check_arg_dtype(node: Node, index: int, allowed: frozenset[torch.dtype], what: str = "input") -> str | None:
    return check_dtype(arg_tensor(node, index), allowed, what)


def bound_args(node: Node, *names: str) -> tuple:
    """Arguments by name, with the schema's defaults (overloads differ in which are positional)."""
    schema = aten_overload(node.target)._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}
    bound.update(zip((a.name for a in schema), node.args))
    bound.update(node.kwargs)
    return tuple(bound.get(name) for name in names)


def first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


def is_static(value: Any) -> bool:
    """True for a plain int (not a SymInt that depends on a dynamic dimension)."""
    return isinstance(value, int) and not isinstance(value, bool)


def static_ints(values: Any) -> bool:
    return isinstance(values, (list, tuple)) and all(is_static(v) for v in values)


def normalize_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def rule_dtypes(allowed: frozenset[torch.dtype], *arg_indices: int) -> Rule:
    """A rule that only checks the dtype of the given tensor arguments (default: the first)."""
    indices = arg_indices or (0,)

    def rule(node: Node) -> str | None:
        return first_reason(*(check_arg_dtype(node, i, allowed) for i in indices))

    return rule
