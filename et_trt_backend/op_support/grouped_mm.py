"""aten._grouped_mm: the MoE expert GEMMs, lowered to the et_trt::GroupedMM plugin op.

Only the MoE forward form is lowered: a 2-D `a` of rows sorted by expert, a
3-D `b` of per-expert weights with static shape [G, K, N] (any strides: a
transposed view of [G, N, K] weights is the plugin's trans_b form), and int32
`offs` of static length G. Rows past offs[-1] come out zero (contract 4), a
defined value where torch leaves them undefined.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, arg_tensor, dtype_name, is_static

aten = torch.ops.aten


def _grouped_mm(node: Node) -> str | None:
    a, b = arg_tensor(node, 0), arg_tensor(node, 1)
    offs_arg = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    bias = node.args[3] if len(node.args) > 3 else node.kwargs.get("bias")
    out_dtype = node.args[4] if len(node.args) > 4 else node.kwargs.get("out_dtype")
    if a is None or b is None:
        return "operands must be tensors"
    if a.dim() != 2 or b.dim() != 3:
        return (
            f"only the MoE form a[rows, K] x b[G, K, N] with offs is lowered; got ranks {a.dim()} and {b.dim()}"
        )
    if offs_arg is None:
        return "offs is required (cumulative row ends per expert, int32)"
    offs = offs_arg.meta.get("val") if isinstance(offs_arg, Node) else None
    if offs is None or offs.dtype != torch.int32 or offs.dim() != 1:
        return "offs must be a 1-D int32 tensor (torch.cumsum(counts, 0, dtype=torch.int32))"
    if bias is not None:
        return "bias is not supported; add the per-expert bias after the grouped GEMM"
    if out_dtype is not None and out_dtype != a.dtype:
        return f"out_dtype {out_dtype} differs from the input dtype; cast the result instead"
    if not all(is_static(s) for s in b.shape):
        return "expert weights b must have a static shape [G, K, N]"
    if not is_static(a.shape[1]):
        return "the reduction dimension K of a must be static"
    if a.dtype not in FLOAT_DTYPES or b.dtype != a.dtype:
        return f"a and b must share one of bf16/fp16/fp32, got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}"
    if not (is_static(offs.shape[0]) and offs.shape[0] == b.shape[0]):
        return "offs must have one entry per expert"
    return None


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten._grouped_mm.default: _grouped_mm,
}
