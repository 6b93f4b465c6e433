"""expert_precision = "int4": a MoE block lowers to the INT4 MoEExperts node (fused) or to INT4 GroupedMMs (the
fallback), its weights quantized at export (et_trt_backend/int4_weights.py) and packed as the kernels read them.

The ONNX, run in float32 by onnx_reference (which unpacks the INT4 weights with numpy, independently of
int4_weights), is checked against the partition run in float32 with each expert weight replaced by its
dequantized INT4 value q * scale: the INT4 form must compute exactly the model with those weights. The packed
weights and scales are checked bit for bit, in the ONNX and after the blob's round trip; NVIDIA's builder (TensorRT
for RTX) builds both forms with our plugins. The example policy's error against bf16 (benchmarks/int4_accuracy.py)
is bounded by what that script measured.
"""

from __future__ import annotations

import collections
import copy
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from onnx import numpy_helper

from et_trt_backend import int4_weights, moe_experts
from et_trt_backend.engines import onnx_build
from et_trt_backend.onnx_analysis import int4_expert_nodes, moe_blocks
from et_trt_backend.plugin_names import GROUPED_MM_OP, INT4_GROUP_SIZE_ATTRIBUTE, MOE_EXPERTS_OP
from et_trt_backend.serialization import blob, external_data
from et_trt_partitioner import TensorRTPartitioner, cli
from support import moe_models, onnx_reference
from support.lowering import delegated_parts, run_partition_float32
from support.nvidia_builders import built_target, serialized_group_sizes, tensorrt_rtx_or_skip

REPO = Path(__file__).resolve().parents[1]
GROUP = 32
# F = 96: the down GEMM's K is three groups of 32, not a multiple of 64; gate+up's K = H = 32.
RECIPE = {"engine_build": "never", "kernel_archs": ["sm_80"], "expert_precision": "int4", "int4_group_size": GROUP}


def _module() -> torch.nn.Module:
    return moe_models.bf16(moe_models.GroupedMoE(ffn=96))


def _edge(module: torch.nn.Module, **options):
    return to_edge_transform_and_lower(moe_models.export(module),
                                       partitioner=[TensorRTPartitioner({"default": {**RECIPE, **options}})])


@pytest.fixture(scope="module")
def edges():
    module = _module()
    return module, {fused: _edge(module, fused_experts=fused) for fused in (True, False)}


@pytest.fixture(scope="module")
def lowered(edges):
    """The module, and per form (fused or not) its one partition: (edge program, blob contents)."""
    module, by_form = edges
    return module, {fused: delegated_parts(edge)[0] for fused, edge in by_form.items()}


def _dequantized(weights: torch.Tensor) -> torch.Tensor:
    """float32 q * scale of expert weights [E, out, in] (K = in, as the lowering quantizes them)."""
    q = int4_weights.quantize(weights.detach(), GROUP)
    return int4_weights.dequantize(q.packed, q.scales, weights.shape[-1], GROUP)


def _initializers(contents) -> dict[str, onnx.TensorProto]:
    model = external_data.onnx_with_weights(contents.onnx, contents.weights)
    return {t.name: t for t in model.graph.initializer}


def _assert_int4_weights(tensor: onnx.TensorProto, scales: onnx.TensorProto, weights: torch.Tensor) -> None:
    """The ONNX's packed weights and scales are int4_weights' of `weights` [E, out, in], bit for bit."""
    q = int4_weights.quantize(weights.detach(), GROUP)
    assert tensor.data_type == onnx.TensorProto.INT8 and list(tensor.dims) == list(q.packed.shape)
    np.testing.assert_array_equal(numpy_helper.to_array(tensor).view(np.uint8), q.packed.numpy())
    assert scales.data_type == onnx.TensorProto.BFLOAT16 and list(scales.dims) == list(q.scales.shape)
    np.testing.assert_array_equal(numpy_helper.to_array(scales).astype(np.float32), q.scales.float().numpy())


def test_fused_block_is_one_int4_moe_experts_node(lowered):
    module, forms = lowered
    _, contents = forms[True]
    model = onnx.load_from_string(contents.onnx)
    (node,) = [n for n in model.graph.node if n.op_type == MOE_EXPERTS_OP]
    assert GROUPED_MM_OP not in {n.op_type for n in model.graph.node}
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes[INT4_GROUP_SIZE_ATTRIBUTE] == GROUP and attributes["gate_up_layout"] == b"blocked8"
    assert len(node.input) == 9 and all(node.input)  # zero biases: every input is a tensor
    initializers = _initializers(contents)
    gate_up, _ = moe_experts.relayout(module.gate_up_proj.detach(), None, "concat", "blocked8")
    _assert_int4_weights(initializers[node.input[3]], initializers[node.input[7]], gate_up)
    _assert_int4_weights(initializers[node.input[4]], initializers[node.input[8]], module.down_proj)
    for bias in node.input[5:7]:
        assert not numpy_helper.to_array(initializers[bias]).astype(np.float32).any()
    # No weight in the part's precision is left but the router's; the INT4 images and the format-free ones.
    assert [list(t.dims) for t in initializers.values() if t.data_type == onnx.TensorProto.BFLOAT16
            and len(t.dims) == 3] == [list(initializers[node.input[7]].dims), list(initializers[node.input[8]].dims)]
    formats = collections.Counter((k.kernel.startswith("moe_"), k.weight_format) for k in contents.kernels)
    assert set(formats) == {(True, "int4"), (True, "dense")}
    assert {k.kernel for k in contents.kernels if k.weight_format == "dense"} == {"moe_route", "moe_combine"}
    (block,) = moe_blocks(model)
    assert block["detail"].endswith(f", INT4 weights (group {GROUP})")


def test_unfused_block_has_int4_grouped_mms(lowered):
    module, forms = lowered
    _, contents = forms[False]
    model = onnx.load_from_string(contents.onnx)
    nodes = [n for n in model.graph.node if n.op_type == GROUPED_MM_OP]
    assert len(nodes) == 2 and all(len(n.input) == 4 for n in nodes)
    initializers = _initializers(contents)
    for node, weights in zip(nodes, (module.gate_up_proj, module.down_proj)):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attributes[INT4_GROUP_SIZE_ATTRIBUTE], attributes["trans_b"]) == (GROUP, 1)
        _assert_int4_weights(initializers[node.input[1]], initializers[node.input[3]], weights)
    assert {k.weight_format for k in contents.kernels} == {"int4"}
    assert [n["op"] for n in int4_expert_nodes(model)] == [GROUPED_MM_OP] * 2


@pytest.mark.parametrize("fused", [True, False])
def test_int4_partition_computes_the_model_with_dequantized_weights(lowered, fused):
    _, forms = lowered
    program, contents = forms[fused]
    twin = copy.deepcopy(program)
    for name, value in twin.state_dict.items():
        if value.dim() == 3:  # the expert weights
            twin.state_dict[name] = _dequantized(value)
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    (spec,) = contents.inputs
    for tokens in (2, 7):
        x = torch.randn(tokens, 32)
        want = run_partition_float32(twin, [x])[0]
        got = onnx_reference.evaluator(model).run(None, {spec.name: x.numpy()})[0]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
        # ... and not the bf16 weights' (the INT4 rounding shows at this size).
        assert not np.allclose(got, run_partition_float32(program, [x])[0].numpy(), rtol=1e-2, atol=1e-3)


def test_int4_blob_round_trips(lowered):
    _, forms = lowered
    _, contents = forms[True]
    data = blob.serialize(contents)
    back = blob.deserialize(data)
    assert back.kernels == contents.kernels and back.onnx == contents.onnx
    assert (back.options.expert_precision, back.options.int4_group_size) == ("int4", GROUP)
    assert {k.weight_format for k in back.kernels} == {"int4", "dense"}
    assert blob.serialize(back) == data


@pytest.mark.parametrize("fused", [True, False], ids=["MoEExperts", "GroupedMM"])
def test_real_builder_builds_the_int4_forms(lowered, fused):
    """TensorRT for RTX's parser and builder with the C++ plugins (libet_trt_plugin.so) build both INT4 forms for
    sm_80, each plugin serializing its group size (test_real_builder.py builds the example policy's for every
    target)."""
    rtx = tensorrt_rtx_or_skip()
    _, contents = lowered[1][fused]
    plan = onnx_build.parse_and_build(rtx, contents, "sm_80").plan
    assert built_target(plan) == 80
    assert serialized_group_sizes(plan) == [GROUP] * (1 if fused else 2)


def test_inspect_shows_the_int4_form(edges, tmp_path, capsys):
    pte = tmp_path / "int4.pte"
    pte.write_bytes(edges[1][True].to_executorch().buffer)
    assert cli.main(["-q", "inspect", str(pte)]) == 0
    out = capsys.readouterr().out
    # w_gate_up [4, 192, 32] + w_down [4, 32, 96]: 36864 values, half a byte each; a 2-byte scale per 32 of them.
    assert ("INT4 experts: 1 MoEExperts, group 32, weights 18.0 KiB packed + 2.2 KiB bf16 scales: "
            "node_moe_experts_int4") in out
    assert f"INT4 weights (group {GROUP})" in out


def test_int4_group_size_without_int4_experts_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering.onnx_export"):  # no kernel: a fast export
        (_, contents), = delegated_parts(_edge(_module(), expert_precision="precision", grouped_gemm_kernel=False,
                                               fused_experts=False))
    assert not int4_expert_nodes(onnx.load_from_string(contents.onnx))
    assert (f"int4_group_size = {GROUP} has no effect on this part: its expert_precision is unset (its experts "
            "stay bf16)") in caplog.text


def test_example_policy_accuracy_against_bf16():
    """Measured (benchmarks/int4_accuracy.py, tokens 2/16/64/512, seeds 0-2, group 128; the policy's K is 64, so
    groups of 64 and 128 are one group a row): each expert GEMM 0.110-0.113 worst (the Gaussian weights' own
    quantization error is 0.108: round-to-nearest 4-bit codes, not the kernels' math), the policy output 0.1295
    worst, 0.0417 mean. Bounds: 1.2x and 1.3x those."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import int4_accuracy

    result = int4_accuracy.fp8_accuracy.measure(tokens=(16, 512), seeds=(1,), mode=int4_accuracy.Int4GroupedMMs(128))
    assert len(result["grouped_mm"]) == 4  # every decoder expert GEMM ran in INT4
    for name, error in result["grouped_mm"].items():
        assert 0.08 < error < 0.135, name  # INT4 rounding shows (it was applied) and stays bounded
    assert max(result["policy"]) < 0.17
