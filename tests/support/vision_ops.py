"""Vision ops of robot policies (patch embeddings, ResNet and UNet encoders), as op_checks families:
convolutions, pooling, normalizations, padding and interpolation, each over a dynamic batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from support import op_checks


def _batch_norm(channels: int, dims: int) -> nn.Module:
    norm = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(channels)
    with torch.no_grad():  # running statistics and affine weights a trained model would have
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
        norm.weight.normal_()
        norm.bias.normal_()
    return norm.eval()


def _inputs(**shapes):
    """Fresh inputs of these shapes, after a batch dimension."""
    return lambda batch: {name: torch.randn(batch, *shape) for name, shape in shapes.items()}


FAMILIES = {
    "convolution": op_checks.Family(
        {
            "conv1d stride 2, pad 1, groups 2": lambda m, i: m["c1"](i["x1"]),
            "conv1d dilation 2, padding same, no bias": lambda m, i: m["c1_same"](i["x1"]),
            "conv2d stride 2, pad 1, dilation 2, groups 2": lambda m, i: m["c2"](i["x2"]),
            "conv2d depthwise, kernel 3x2, stride (2, 1), pad (1, 2)": lambda m, i: m["c2_dw"](i["x2"]),
            "conv2d patch embedding (kernel = stride 3)": lambda m, i: m["c2_patch"](i["x2"]),
            "conv3d padding same": lambda m, i: m["c3"](i["x3"]),
            "conv_transpose1d stride 2": lambda m, i: m["t1"](i["x1"]),
            "conv_transpose2d stride 2, pad 1, output_padding 1, groups 2": lambda m, i: m["t2"](i["x2"]),
            "conv_transpose3d stride 2": lambda m, i: m["t3"](i["x3"]),
        },
        {
            "c1": nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
            "c1_same": nn.Conv1d(4, 5, 3, dilation=2, padding="same", bias=False),
            "c2": nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
            "c2_dw": nn.Conv2d(4, 4, (3, 2), stride=(2, 1), padding=(1, 2), groups=4),
            "c2_patch": nn.Conv2d(4, 8, 3, stride=3),
            "c3": nn.Conv3d(2, 3, 3, padding="same"),
            "t1": nn.ConvTranspose1d(4, 6, 3, stride=2),
            "t2": nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
            "t3": nn.ConvTranspose3d(2, 2, 2, stride=2),
        },
        _inputs(x1=(4, 9), x2=(4, 9, 9), x3=(2, 4, 4, 4)),
        dynamic_batch=True,
    ),
    "pooling": op_checks.Family(
        {
            "max_pool2d kernel 3, stride 2, pad 1": lambda m, i: F.max_pool2d(i["x"], 3, 2, 1),
            "max_pool2d ceil_mode": lambda m, i: F.max_pool2d(i["x"], 3, 2, ceil_mode=True),
            "max_pool1d": lambda m, i: F.max_pool1d(i["y"], 3, 2, 1),
            "max_pool3d": lambda m, i: F.max_pool3d(i["z"], 2),
            "avg_pool2d count_include_pad=False": lambda m, i: F.avg_pool2d(i["x"], 3, 2, 1, count_include_pad=False),
            "avg_pool2d count_include_pad=True": lambda m, i: F.avg_pool2d(i["x"], 3, 2, 1),
            "avg_pool2d ceil_mode": lambda m, i: F.avg_pool2d(i["x"], 3, 2, 1, ceil_mode=True),
            "avg_pool1d": lambda m, i: F.avg_pool1d(i["y"], 2),
            "avg_pool3d": lambda m, i: F.avg_pool3d(i["z"], 2),
            "adaptive_avg_pool2d (3, 2) of 8x7": lambda m, i: F.adaptive_avg_pool2d(i["w"], (3, 2)),
            "adaptive_avg_pool2d 1 (global)": lambda m, i: F.adaptive_avg_pool2d(i["x"], 1),
            "adaptive_avg_pool1d 3 of 8": lambda m, i: F.adaptive_avg_pool1d(i["y"], 3),
            "adaptive_max_pool2d 2 of 8x8": lambda m, i: F.adaptive_max_pool2d(i["x"], 2),
        },
        {},
        _inputs(x=(3, 8, 8), y=(3, 8), z=(2, 4, 4, 4), w=(3, 8, 7)),
        dynamic_batch=True,
    ),
    "normalization": op_checks.Family(
        {
            "group_norm 2 groups, affine": lambda m, i: m["gn"](i["x"]),
            "group_norm of 4-D, no affine": lambda m, i: m["gn_plain"](i["x4"]),
            "batch_norm2d eval": lambda m, i: m["bn2"](i["x4"]),
            "batch_norm1d eval": lambda m, i: m["bn1"](i["x"]),
            "instance_norm2d affine": lambda m, i: m["in2"](i["x4"]),
            "instance_norm1d": lambda m, i: m["in1"](i["x"]),
            "layer_norm without bias": lambda m, i: m["ln"](i["x"]),
            "layer_norm over two dims": lambda m, i: F.layer_norm(i["x4"], (5, 5)),
            "rms_norm": lambda m, i: m["rms"](i["x"]),
        },
        {
            "gn": nn.GroupNorm(2, 4), "gn_plain": nn.GroupNorm(4, 4, affine=False),
            "bn2": _batch_norm(4, 2), "bn1": _batch_norm(4, 1),
            "in2": nn.InstanceNorm2d(4, affine=True), "in1": nn.InstanceNorm1d(4),
            "ln": nn.LayerNorm(5, bias=False), "rms": nn.RMSNorm(5),
        },
        _inputs(x=(4, 5), x4=(4, 5, 5)),
        dynamic_batch=True,
    ),
    "padding": op_checks.Family(
        {
            "constant 0.5": lambda m, i: F.pad(i["x"], (1, 2, 0, 1), value=0.5),
            "constant, negative pads crop": lambda m, i: F.pad(i["x"], (-1, 2, 0, -1)),
            "reflect 2-D": lambda m, i: F.pad(i["x"], (1, 2, 2, 1), mode="reflect"),
            "replicate 2-D": lambda m, i: F.pad(i["x"], (1, 2, 2, 1), mode="replicate"),
            "reflect 1-D": lambda m, i: F.pad(i["y"], (2, 1), mode="reflect"),
            "replicate 1-D": lambda m, i: F.pad(i["y"], (0, 3), mode="replicate"),
        },
        {},
        _inputs(x=(2, 4, 4), y=(2, 4)),
        dynamic_batch=True,
    ),
    "interpolate": op_checks.Family(
        {
            "nearest x2": lambda m, i: F.interpolate(i["x"], scale_factor=2, mode="nearest"),
            "nearest x1.5": lambda m, i: F.interpolate(i["y"], scale_factor=1.5, mode="nearest"),
            "nearest to 7x3": lambda m, i: F.interpolate(i["y"], size=(7, 3), mode="nearest"),
            "bilinear to 7x6": lambda m, i: F.interpolate(i["x"], size=(7, 6), mode="bilinear"),
            "bilinear x2 align_corners": lambda m, i: F.interpolate(i["x"], scale_factor=2, mode="bilinear",
                                                                    align_corners=True),
            "bilinear x0.5 (down)": lambda m, i: F.interpolate(i["x"], scale_factor=0.5, mode="bilinear"),
        },
        {},
        _inputs(x=(2, 4, 4), y=(2, 5, 5)),
        dynamic_batch=True,
    ),
}
