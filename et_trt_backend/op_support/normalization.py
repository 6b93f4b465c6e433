"""Normalizations: layer, group, batch (eval) and instance norm (TensorRT Normalization layers, or the
Reduce + ElementWise forms the ONNX exporter writes).

What edge programs hand over: nn.LayerNorm (with or without bias) -> native_layer_norm; nn.GroupNorm ->
native_group_norm; nn.BatchNorm*d in eval -> _native_batch_norm_legit_no_training; nn.InstanceNorm*d ->
_native_batch_norm_legit.no_stats over the input viewed as one sample of N*C channels. RMSNorm (nn.RMSNorm,
transformers' own) arrives decomposed into pow / mean / rsqrt / mul. Each returns (out, mean, rstd); only
`out` is used in inference, and the lowering computes only what is used.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, arg_tensor, bound_args, check_arg_dtype, first_reason, is_static

aten = torch.ops.aten


def _layer_norm(node: Node) -> str | None:
    normalized = node.args[1]
    x = arg_tensor(node, 0)
    if x is not None and not all(is_static(s) for s in x.shape[x.dim() - len(normalized):]):
        return "layer norm over a dynamic dimension is not supported"
    return check_arg_dtype(node, 0, FLOAT_DTYPES)


def _float_operands(node: Node) -> str | None:
    return first_reason(check_arg_dtype(node, 0, FLOAT_DTYPES), check_arg_dtype(node, 1, FLOAT_DTYPES, "weight"),
                        check_arg_dtype(node, 2, FLOAT_DTYPES, "bias"))


def _channels_static(node: Node, what: str) -> str | None:
    x = arg_tensor(node, 0)
    if x is None or x.dim() < 2:
        return f"{what} needs an input of rank >= 2 (batch, channels, ...)"
    if not is_static(x.shape[1]):
        return f"{what} over a dynamic channel dimension (dim 1): its per-channel weights need it static"
    return _float_operands(node)


def _group_norm(node: Node) -> str | None:
    return _channels_static(node, "group norm")


def _batch_norm_eval(node: Node) -> str | None:
    return _channels_static(node, "batch norm")


def _instance_norm(node: Node) -> str | None:
    # Its "channels" are the batch's N*C (instance norm's view): dynamic with the batch, which the lowering's
    # form (statistics by ReduceMean, then BatchNormalization) takes.
    (training,) = bound_args(node, "training")
    if not training:
        return "batch norm without running statistics outside training mode is undefined in PyTorch"
    return _float_operands(node)


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.native_layer_norm.default: _layer_norm,
    aten.native_group_norm.default: _group_norm,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_eval,
    aten._native_batch_norm_legit.no_stats: _instance_norm,
}
