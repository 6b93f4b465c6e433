"""The ops of robot policies beyond the MoE: vision (support/vision_ops.py: convolutions, pooling,
normalizations, padding, interpolation) and math (support/math_ops.py: elementwise, activations, reductions,
index_put, bucketize, embedding). Each family is exported once as a module of independent ops and delegated
whole; each op's result, from the partition's ONNX (onnxruntime) on fresh inputs (at batch 1 and 3 where the
batch is dynamic), matches PyTorch in float64 (integer and bool results exactly), and each family's partition
parses and builds with NVIDIA's builder (TensorRT for RTX) for sm_80 and sm_86. Refusals name the argument
TensorRT cannot take and the fix."""

from __future__ import annotations

import operator

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from et_trt_backend import op_support, preflight
from support import math_ops, op_checks, vision_ops
from support.fx_nodes import call, meta
from support.nvidia_builders import tensorrt_rtx_or_skip

aten = torch.ops.aten
FAMILIES = {**vision_ops.FAMILIES, **math_ops.FAMILIES}
CASES = [pytest.param(family, name, id=f"{family}: {name}") for family, f in FAMILIES.items() for name in f.ops]


@pytest.mark.parametrize("family, name", CASES)
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
    indices = node.graph.call_function(operator.getitem, (node, 1))
    if used:
        node.graph.call_function(aten.relu.default, (indices,))
    return node


_INT64 = torch.int64
REFUSALS = [
    pytest.param(lambda: call(aten.convolution.default, meta(1, 4, 5, 5), meta(4, 6, 3, 3), None, [2, 2], [0, 0],
                              [2, 2], True, [0, 0], 1),
                 "transposed convolution with dilation [2, 2]", id="deconv-dilation"),
    pytest.param(lambda: call(aten.max_pool2d_with_indices.default, meta(1, 3, 8, 8), [2, 2], [2, 2], [0, 0], [2, 2]),
                 "max pooling with dilation [2, 2]", id="maxpool-dilation"),
    pytest.param(lambda: _pool_with_indices(used=True), "indices of max pooling are used", id="maxpool-indices"),
    pytest.param(lambda: call(aten.avg_pool2d.default, meta(1, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, 3),
                 "divisor_override=3", id="avgpool-divisor"),
    pytest.param(lambda: call(aten.index_put.default, meta(3, 5, dtype=torch.int32), [None, meta(2, dtype=_INT64)],
                              meta(3, 2, dtype=torch.int32), True),
                 "by a float MatMul) has dtype int32", id="accumulate-int"),
    pytest.param(lambda: call(aten.index_put.default, meta(3, 5, 4),
                              [meta(2, dtype=_INT64), None, meta(2, dtype=_INT64)], meta(2, 5)),
                 "non-adjacent dimensions", id="index_put-non-adjacent"),
    pytest.param(lambda: call(aten.index_put.default, meta(3, 5), [None, meta(2, 2, dtype=_INT64)], meta(3, 2, 2),
                              True),
                 "one 1-D index tensor", id="accumulate-2d-index"),
    pytest.param(lambda: call(aten.index_put.default, meta(3, 5), [None, meta(5, dtype=torch.bool)], meta(3, 2)),
                 "boolean mask", id="index_put-mask"),
    pytest.param(lambda: call(aten.bucketize.Tensor, meta(4), meta(2, 3)), "1-D tensor of boundaries",
                 id="bucketize-2d"),
]


@pytest.mark.parametrize("node, fragment", REFUSALS)
def test_refusals_name_the_argument(node, fragment):
    reason = op_support.unsupported_reason(node())
    assert reason and fragment in reason, reason


def test_unused_max_pool_indices_are_no_refusal():
    assert op_support.unsupported_reason(_pool_with_indices(used=False)) is None


def test_preflight_refuses_a_dilated_conv_transpose():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", dilations=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 6, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    violations = preflight.check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert [v.rule for v in violations] == ["attributes"] and "dilations=[2, 2]" in str(violations[0])


def test_bucketize_is_preserved_through_to_edge():
    assert aten.bucketize.Tensor in op_support.PRESERVED_OPS
