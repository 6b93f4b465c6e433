"""torch.bucketize: which bucket of sorted boundaries each value falls in (compare + ReduceSum in TensorRT).

Not core ATen and without an ExecuTorch kernel: op_support.PRESERVED_OPS keeps it through to_edge, and
the partitioner must delegate it. The lowering counts the boundaries below each value
(translations.bucketize), so it needs a [..., len(boundaries)] comparison: fine for the tens to
thousands of boundaries of action tokenizers and bin embeddings.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import NUMERIC_DTYPES, Rule, arg_tensor, check_arg_dtype, first_reason

aten = torch.ops.aten


def _bucketize(node: Node) -> str | None:
    boundaries = arg_tensor(node, 1)
    if boundaries is None or boundaries.dim() != 1:
        return "bucketize needs a 1-D tensor of boundaries"
    return first_reason(check_arg_dtype(node, 0, NUMERIC_DTYPES),
                        check_arg_dtype(node, 1, NUMERIC_DTYPES, "boundaries"))


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.bucketize.Tensor: _bucketize,
}
