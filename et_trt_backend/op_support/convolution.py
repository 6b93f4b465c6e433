"""Convolutions, 1-D to 3-D, plain and transposed (TensorRT Convolution and Deconvolution layers).

aten.convolution is what every nn.Conv*d / ConvTranspose*d and F.conv* call becomes in an edge program.
TensorRT builds a convolution's kernel ahead of time: the weights' shape (so the channel counts and the
kernel size) must be static; strides, padding, dilation and groups are static ints in ATen already.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ._common import FLOAT_DTYPES, Rule, arg_tensor, bound_args, check_arg_dtype, first_reason, is_static

aten = torch.ops.aten

_SPATIAL_RANKS = {3: "1-D", 4: "2-D", 5: "3-D"}


def _convolution(node: Node) -> str | None:
    x, weight = arg_tensor(node, 0), arg_tensor(node, 1)
    if x is None or weight is None:
        return "input and weight must be tensors"
    if x.dim() not in _SPATIAL_RANKS:
        return f"input of rank {x.dim()}; TensorRT convolves 1-D, 2-D and 3-D inputs (rank 3-5, batch first)"
    if not all(is_static(s) for s in weight.shape):
        return "the weight's shape must be static (TensorRT builds the kernel ahead of time)"
    if not is_static(x.shape[1]):
        return "the input's channel dimension (dim 1) must be static"
    transposed, dilation = bound_args(node, "transposed", "dilation")
    if transposed and any(d != 1 for d in dilation):
        return (f"transposed convolution with dilation {list(dilation)}: TensorRT's deconvolution is not built "
                "with dilation (NVIDIA's builder refuses it); use dilation 1")
    return first_reason(
        check_arg_dtype(node, 0, FLOAT_DTYPES),
        check_arg_dtype(node, 1, FLOAT_DTYPES, "weight"),
        check_arg_dtype(node, 2, FLOAT_DTYPES, "bias"),
    )


RULES: dict[torch._ops.OpOverload, Rule] = {
    aten.convolution.default: _convolution,
}
