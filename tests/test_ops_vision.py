"""Vision ops of robot policies (patch embeddings, ResNet and UNet encoders): convolutions, pooling,
normalizations, padding and interpolation. Each family is exported once as a module of independent ops over a
dynamic batch and delegated whole; each op's result, from the partition's ONNX (onnxruntime) on fresh inputs
at two batch sizes, matches PyTorch in float64; the partition parses and builds with NVIDIA's builder
(TensorRT for RTX) for sm_80 and sm_86. The refusals say which argument TensorRT cannot take and why."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import op_checks
from et_trt_backend import op_support, preflight
from nvidia_builders import tensorrt_rtx_or_skip
from test_op_support import call, meta

aten = torch.ops.aten


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
CASES = [(family, name) for family, f in FAMILIES.items() for name in f.ops]


@pytest.mark.parametrize("family, name", CASES, ids=[f"{f}: {n}" for f, n in CASES])
def test_op_matches_pytorch_in_float64(family, name):
    FAMILIES[family].assert_op_matches_float64(name)


@pytest.mark.parametrize("family", FAMILIES)
def test_nvidia_builder_takes_the_partition(family):
    op_checks.assert_builds(tensorrt_rtx_or_skip(), FAMILIES[family].lowered)


def test_bf16_transposed_convolution_runs_in_float32_and_builds():
    """NVIDIA's builder builds no bf16 deconvolution: the lowering casts around it, and the rest stays bf16."""
    layers = {"t": nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), "c": nn.Conv2d(6, 4, 3)}
    module = op_checks.Ops({"conv(conv_transpose(x))": lambda m, i: m["c"](m["t"](i["x"]))}, layers).bfloat16()
    whole = op_checks.export_whole(module, {"x": torch.randn(1, 4, 5, 5, dtype=torch.bfloat16)},
                                   recipe={"default": {"precision": "bf16", "engine_build": "never"}})
    graph = whole.model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    (deconv,), (conv,) = ([n for n in graph.node if n.op_type == op] for op in ("ConvTranspose", "Conv"))
    assert types[deconv.input[0]] == onnx.TensorProto.FLOAT
    assert types[conv.input[0]] == onnx.TensorProto.BFLOAT16
    op_checks.assert_builds(tensorrt_rtx_or_skip(), whole)


# ---- refusals: the argument TensorRT cannot take, and what to do -----------------------------------------
def _pool_with_indices(used: bool):
    node = call(aten.max_pool2d_with_indices.default, meta(1, 3, 8, 8, dtype=torch.float32), [2, 2])
    indices = node.graph.call_function(lambda *a: None, (node, 1))
    indices.target = __import__("operator").getitem
    if used:
        node.graph.call_function(torch.ops.aten.relu.default, (indices,))
    return node


@pytest.mark.parametrize("node, fragment", [
    (lambda: call(aten.convolution.default, meta(1, 4, 5, 5), meta(4, 6, 3, 3), None, [2, 2], [0, 0], [2, 2], True,
                  [0, 0], 1), "transposed convolution with dilation [2, 2]"),
    (lambda: call(aten.max_pool2d_with_indices.default, meta(1, 3, 8, 8), [2, 2], [2, 2], [0, 0], [2, 2]),
     "max pooling with dilation [2, 2]"),
    (lambda: _pool_with_indices(used=True), "indices of max pooling are used"),
    (lambda: call(aten.avg_pool2d.default, meta(1, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, 3),
     "divisor_override=3"),
], ids=["deconv-dilation", "maxpool-dilation", "maxpool-indices", "avgpool-divisor"])
def test_refusals_name_the_argument(node, fragment):
    reason = op_support.unsupported_reason(node())
    assert reason and fragment in reason, reason


def test_unused_max_pool_indices_are_no_refusal():
    assert op_support.unsupported_reason(_pool_with_indices(used=False)) is None


def test_preflight_refuses_a_dilated_conv_transpose():
    from onnx import TensorProto, helper

    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", dilations=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 6, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    violations = preflight.check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert [v.rule for v in violations] == ["attributes"] and "dilations=[2, 2]" in str(violations[0])
