"""Data checks: aten._assert_async.msg(condition, message) becomes an engine check.

The lowering (lowering/checks.py) makes each condition an extra engine output
that the delegate reads after the run and fails the call with the message
where it is false: a check on the data that TensorRT itself cannot raise. The
partitioner's counted-rows rewrite (partitioner/counted_rows.py) writes them;
a model's own torch._assert_async(condition, message) is taken the same way.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import TENSOR_DTYPES, Rule, arg_tensor

aten = torch.ops.aten


def _assert_async(node: Node) -> str | None:
    condition = arg_tensor(node, 0)
    if condition is None or condition.dim() != 0 or condition.dtype not in TENSOR_DTYPES:
        return "an engine check takes one condition: a scalar tensor (bool or number)"
    return None


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten._assert_async.msg: _assert_async,
}
