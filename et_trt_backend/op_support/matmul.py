"""Dense matrix products (TensorRT MatrixMultiply layer)."""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, arg_tensor, check_arg_dtype, first_reason

aten = torch.ops.aten


def _matmul(ranks: tuple[int, ...], operands: tuple[int, ...]) -> Rule:
    def rule(node: Node) -> str | None:
        for i in operands:
            t = arg_tensor(node, i)
            if t is not None and t.dim() not in ranks:
                return f"operand {i} has rank {t.dim()}; {node.target} needs rank {' or '.join(map(str, ranks))}"
        return first_reason(*(check_arg_dtype(node, i, FLOAT_DTYPES, f"operand {i}") for i in operands))

    return rule


def _addmm(node: Node) -> str | None:
    beta = node.kwargs.get("beta", 1)
    alpha = node.kwargs.get("alpha", 1)
    if not isinstance(beta, (int, float)) or not isinstance(alpha, (int, float)):
        return "addmm with tensor alpha/beta is not supported"
    return _matmul((1, 2), (0, 1, 2))(node)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.mm.default: _matmul((2,), (0, 1)),
    aten.bmm.default: _matmul((3,), (0, 1)),
    aten.addmm.default: _addmm,
}
