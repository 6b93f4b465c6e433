"""expert_precision = "fp8": a MoE block lowers to one MoEExperts node with FP8 weights (fused), and GroupedMMs with
constant weights that are no fused block's lower to the FP8 GroupedMM.

The ONNX (its FP8 GroupedMM and MoEExperts run by onnx_reference's numpy/ml_dtypes forms) is checked against PyTorch
running the contract's reference (et_trt_backend/quantization.py, moe_experts_fp8.py) on fresh random inputs, and the
fused partition against the model run in float32 with its expert weights replaced by their dequantized FP8 values;
the FP8 weights are checked bit for bit, in the ONNX and after the blob's round trip through named data; NVIDIA's
builder (TensorRT for RTX) builds the fused node with our plugin for both FP8 targets it has.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from onnx import numpy_helper

from et_trt_backend import moe_experts, moe_experts_fp8, preflight, quantization
from et_trt_backend.engines import onnx_build
from et_trt_backend.lowering import GroupedMMUse, LoweringError, lower_to_onnx
from et_trt_backend.onnx_analysis import fp8_grouped_mms, fp8_moe_experts, moe_blocks
from et_trt_backend.options import parse_options
from et_trt_backend.plugin_names import GROUPED_MM_OP, INT4_GROUP_SIZE_ATTRIBUTE, MOE_EXPERTS_OP
from et_trt_backend.serialization import blob, external_data
from et_trt_partitioner import TensorRTPartitioner, cli
from support import moe_models, onnx_reference
from support.lowering import concrete_shape, delegated_parts, run_partition_float32
from support.nvidia_builders import (
    built_target,
    serialized_group_sizes,
    serialized_kernel_images_ids,
    tensorrt_rtx_or_skip,
)

REPO = Path(__file__).resolve().parents[1]
FP8 = parse_options({"expert_precision": "fp8", "kernel_archs": ["sm_90a"]})
aten = torch.ops.aten


class _Experts(torch.nn.Module):
    """One GroupedMM of each weight layout: w1 stored [G, N, K] (used transposed), w2 [G, K, N]."""

    def __init__(self, groups=4, k=64, n=72):  # scales of 1 KiB or more: named data, as the weights
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(groups, n, k, dtype=torch.bfloat16))
        self.w2 = torch.nn.Parameter(torch.randn(groups, n, k + 24, dtype=torch.bfloat16))

    def forward(self, a, offs):
        h = torch._grouped_mm(a, self.w1.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2, offs=offs)


def _export(model, rows=24):
    a = torch.randn(rows, model.w1.shape[2], dtype=torch.bfloat16)
    offs = torch.tensor([5, 5, 12, rows], dtype=torch.int32)
    return torch.export.export(model, (a, offs), dynamic_shapes=({0: torch.export.Dim("rows", max=256)}, None))


@pytest.fixture(scope="module")
def lowered():
    model = _Experts().eval()
    return model, lower_to_onnx(_export(model), FP8)


def _initializers(lowered_partition) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in lowered_partition.with_weights().graph.initializer}


def test_constant_weights_become_fp8_weights_and_scales(lowered):
    model, low = lowered
    assert low.grouped_mms == [GroupedMMUse("bf16", True, "fp8")] * 2
    nodes = [n for n in low.onnx.graph.node if n.op_type == "GroupedMM"]
    assert len(nodes) == 2 and all(len(n.input) == 4 for n in nodes)
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in nodes for a in n.attribute if a.name == "trans_b")
    initializers = _initializers(low)
    for node, weight in zip(nodes, (model.w1, model.w2.transpose(-2, -1))):  # both as [G, N, K]
        b_q, b_scale = quantization.quantize_weights_fp8(weight.detach())
        b, scale = initializers[node.input[1]], initializers[node.input[3]]
        assert b.data_type == onnx.TensorProto.FLOAT8E4M3FN and list(b.dims) == list(b_q.shape)
        np.testing.assert_array_equal(np.frombuffer(b.raw_data, np.uint8), b_q.view(torch.uint8).numpy().ravel())
        np.testing.assert_array_equal(numpy_helper.to_array(scale), b_scale.numpy())
    # The bf16 weights left; the FP8 ones and their scales are named data, at one byte a weight.
    assert not [t for t in initializers.values() if t.data_type == onnx.TensorProto.BFLOAT16]
    sizes = {w.name: w.data.size for w in low.weights}
    for node, weight in zip(nodes, (model.w1, model.w2)):
        assert sizes[node.input[1]] == weight.numel() == weight.nbytes // 2
        assert sizes[node.input[3]] == 4 * weight.shape[0] * (weight.shape[1] if weight is model.w1 else weight.shape[2])
    assert [e["weights_bytes"] for e in fp8_grouped_mms(low.onnx)] == [model.w1.numel(), model.w2.numel()]


def test_onnx_matches_the_pytorch_reference(lowered):
    model, low = lowered
    session = onnx_reference.evaluator(onnx_reference.to_float32(low.with_weights()))
    w1 = quantization.quantize_weights_fp8(model.w1.detach())
    w2 = quantization.quantize_weights_fp8(model.w2.detach().transpose(-2, -1))
    for rows, offs in ((1, [0, 1, 1, 1]), (24, [5, 5, 12, 24]), (200, [90, 10, 150, 300]), (7, [-3, 2, 9, 4])):
        a = torch.randn(rows, model.w1.shape[2], dtype=torch.bfloat16).float()
        offs = torch.tensor(offs, dtype=torch.int32)
        h = quantization.grouped_mm_fp8_reference(a, *w1, offs)
        expected = quantization.grouped_mm_fp8_reference(h, *w2, offs)
        (got,) = session.run(None, {"a": a.numpy(), "offs": offs.numpy()})
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_fp8_weights_survive_the_blob_round_trip(lowered):
    _, low = lowered
    contents = blob.BlobContents(part="experts", inputs=low.inputs, outputs=low.outputs, options=FP8,
                                 onnx=low.onnx_bytes, kernels=[], engines=[],
                                 producer=blob.producer_versions(17), weights=low.weights)
    back = blob.deserialize(blob.serialize(contents))
    external_data.attach(back, external_data.store_lookup(external_data.store_output(contents, None)), "the store")
    assert back.options.expert_precision == "fp8"
    expected, got = _initializers(low), {t.name: t for t in back.weights and
                                         external_data.onnx_with_weights(back.onnx, back.weights).graph.initializer}
    for name, tensor in expected.items():
        assert got[name].data_type == tensor.data_type and got[name].raw_data == tensor.raw_data, name


# ---- the fused form: one MoEExperts node with FP8 weights ----------------------------------------------------------
FP8_TARGETS = ["sm_89", "sm_120a"]  # the RTX targets with FP8 tensor cores
FUSED_RECIPE = {"engine_build": "never", "kernel_archs": FP8_TARGETS, "expert_precision": "fp8"}


@pytest.fixture(scope="module")
def fused():
    """A bf16 MoE block (H = 32, F = 96: the down GEMM's K is not a multiple of 128, its last activation block
    partial), its edge program, and its one partition: (module, edge, edge program, blob contents)."""
    module = moe_models.bf16(moe_models.GroupedMoE(ffn=96))
    edge = to_edge_transform_and_lower(moe_models.export(module),
                                       partitioner=[TensorRTPartitioner({"default": FUSED_RECIPE})])
    (program, contents), = delegated_parts(edge)
    return module, edge, program, contents


def _fused_node(contents) -> onnx.NodeProto:
    model = onnx.load_from_string(contents.onnx)
    assert GROUPED_MM_OP not in {n.op_type for n in model.graph.node}
    (node,) = [n for n in model.graph.node if n.op_type == MOE_EXPERTS_OP]
    return node


def _dequantized_experts(program: torch.export.ExportedProgram, stored_in_out: bool = False) \
        -> torch.export.ExportedProgram:
    """A copy of the partition whose expert weights (the 3-D ones, [E, out, in], or [E, in, out] where
    `stored_in_out`) are their dequantized FP8 values (a scale per output channel)."""
    twin = copy.deepcopy(program)
    for name, value in twin.state_dict.items():
        if value.dim() == 3:
            weights = value.transpose(1, 2) if stored_in_out else value
            dequantized = moe_experts_fp8.dequantize(*quantization.quantize_weights_fp8(weights))
            twin.state_dict[name] = dequantized.transpose(1, 2) if stored_in_out else dequantized
    return twin


def test_fused_block_is_one_fp8_moe_experts_node(fused):
    module, _, _, contents = fused
    node = _fused_node(contents)
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes[INT4_GROUP_SIZE_ATTRIBUTE] == 0 and attributes["gate_up_layout"] == b"blocked8"
    assert len(node.input) == 9 and all(node.input)  # zero biases: every input is a tensor
    model = external_data.onnx_with_weights(contents.onnx, contents.weights)
    initializers = {t.name: t for t in model.graph.initializer}
    gate_up, _ = moe_experts.relayout(module.gate_up_proj.detach(), None, "concat", "blocked8")
    for weights, scales, value in ((3, 7, gate_up), (4, 8, module.down_proj.detach())):
        q, scale = quantization.quantize_weights_fp8(value)
        tensor = initializers[node.input[weights]]
        assert tensor.data_type == onnx.TensorProto.FLOAT8E4M3FN and list(tensor.dims) == list(q.shape)
        np.testing.assert_array_equal(np.frombuffer(tensor.raw_data, np.uint8), q.view(torch.uint8).numpy().ravel())
        assert initializers[node.input[scales]].data_type == onnx.TensorProto.FLOAT
        np.testing.assert_array_equal(numpy_helper.to_array(initializers[node.input[scales]]), scale.numpy())
    for bias in node.input[5:7]:
        assert not numpy_helper.to_array(initializers[bias]).astype(np.float32).any()
    # No expert weight in the part's precision is left; the FP8 images and the format-free combine.
    assert not [t for t in initializers.values() if t.data_type == onnx.TensorProto.BFLOAT16 and len(t.dims) == 3]
    formats = collections.Counter((k.kernel.startswith("moe_"), k.weight_format) for k in contents.kernels)
    assert set(formats) == {(True, "fp8"), (True, "dense")}
    assert {k.kernel for k in contents.kernels if k.weight_format == "dense"} == {"moe_combine"}
    assert {k.arch for k in contents.kernels} == set(FP8_TARGETS)
    model = onnx.load_from_string(contents.onnx)
    (block,) = moe_blocks(model)
    assert block["form"] == MOE_EXPERTS_OP
    assert block["detail"].endswith(", FP8 weights (e4m3, a float32 scale per output channel)")
    # w_gate_up [4, 192, 32] + w_down [4, 32, 96]: a byte each; a float32 scale per output channel.
    assert fp8_moe_experts(model) == [{"node": node.name, "weights_bytes": 4 * 192 * 32 + 4 * 32 * 96,
                                      "scales_bytes": 4 * (4 * 192 + 4 * 32)}]


def test_preflight_takes_the_fused_fp8_form_and_names_what_is_wrong_in_it(fused):
    contents = fused[3]
    model = onnx.load_from_string(contents.onnx)
    assert preflight.check(model) == []
    (node,) = [n for n in model.graph.node if n.op_type == MOE_EXPERTS_OP]
    next(t for t in model.graph.initializer if t.name == node.input[7]).data_type = onnx.TensorProto.BFLOAT16
    for value in model.graph.value_info:  # INT4's scale type, wherever the ONNX records the type
        if value.name == node.input[7]:
            value.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    messages = [v.message for v in preflight.check(model)]
    assert any("w_gate_up_scale is BF16; the plugin takes FP32 scales" in m for m in messages), messages
    del node.input[8]  # 8 inputs: neither the dense nor a quantized form
    assert any("needs inputs hidden, topk_ids, topk_weights, w_gate_up, w_down" in v.message
               for v in preflight.check(model))


def _relative_error(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_fused_fp8_partition_computes_the_model_with_dequantized_weights(fused):
    """The ONNX's float32 twin (onnx_reference: numpy FP8, independently of moe_experts_fp8) against the partition
    run in float32 with each expert weight replaced by its dequantized FP8 value: only the activations' e4m3
    roundings differ (unit roundoff 2**-4, tests/test_moe_experts_fp8_gpu.py's bound; measured here 3.8e-2 to
    4.6e-2 in 30 runs at these token counts; random normal blocks give 3.9e-2 to 4.4e-2); against the bf16
    weights, the weights' rounding adds to it."""
    _, _, program, contents = fused
    twin = _dequantized_experts(program)
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    (spec,) = contents.inputs
    for tokens in (24, 64):
        x = torch.randn(tokens, 32)
        got = onnx_reference.evaluator(model).run(None, {spec.name: x.numpy()})[0]
        error = _relative_error(got, run_partition_float32(twin, [x])[0].numpy())
        assert 1e-3 < error < 6.25e-2, error  # the activations' rounding shows (they were quantized), bounded
        assert _relative_error(got, run_partition_float32(program, [x])[0].numpy()) > error


def test_gpt_oss_block_with_biases_lowers_to_the_fp8_form():
    """transformers' GPT-OSS block (biased experts, interleaved clamped GLU): its FP8 MoEExperts node keeps the
    model's biases in the part's precision and computes the block with its dequantized FP8 weights, biases added
    where the kernels add them (ONNX float32 twin against the partition in float32)."""
    x = torch.randn(1, 6, moe_models.HF_HIDDEN).to(moe_models.DTYPE)
    with torch.no_grad():
        exported = torch.export.export(moe_models.hf_moe_block("gpt_oss"), (x,),
                                       dynamic_shapes=({1: torch.export.Dim("tokens", min=1, max=512)},))
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner({"default": FUSED_RECIPE})])
    (program, contents), = delegated_parts(edge)
    node = _fused_node(contents)
    assert len(node.input) == 9
    model = external_data.onnx_with_weights(contents.onnx, contents.weights)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(initializers[name].astype(np.float32).any() for name in node.input[5:7])  # the model's own biases
    assert "gptoss_glu" in moe_blocks(model)[0]["detail"]
    twin = _dequantized_experts(program, stored_in_out=True)  # transformers' GPT-OSS: [E, H, 2F] and [E, F, H]
    reference = onnx_reference.to_float32(model)
    (spec,) = contents.inputs
    x = torch.randn(concrete_shape(spec, 48))
    got = onnx_reference.evaluator(reference).run(None, {spec.name: x.numpy()})
    want = run_partition_float32(twin, [x])
    (index,) = [i for i, value in enumerate(want) if value.shape == x.shape]  # the block's output (not the router's)
    assert 1e-3 < _relative_error(got[index], want[index].numpy()) < 6.25e-2


def test_lowering_op_matches_the_independent_fp8_reference():
    """The lowering's op (moe_experts_fp8.reference) against onnx_reference's numpy form on fresh bf16 inputs, every
    id routed or invalid, experts left empty: the same e4m3 roundings of the same values, far closer than the 4e-2
    the quantization costs."""
    import ml_dtypes

    tokens, k, experts, size, ffn = 37, 2, 6, 64, 160
    hidden = torch.randn(tokens, size).bfloat16()
    ids = torch.randint(-1, experts - 2, (tokens, k), dtype=torch.int32)  # experts 4, 5 empty
    routing = torch.rand(tokens, k)
    w_gate_up = (torch.randn(experts, 2 * ffn, size) / size**0.5).bfloat16()
    w_down = (torch.randn(experts, size, ffn) / ffn**0.5).bfloat16()
    b_gate_up, b_down = torch.zeros(experts, 2 * ffn).bfloat16(), torch.zeros(experts, size).bfloat16()
    (q1, s1), (q2, s2) = moe_experts_fp8.quantize_weights(w_gate_up, w_down)
    got = torch.ops.et_trt_lowering.moe_experts_fp8(hidden, ids, routing, q1, q2, b_gate_up, b_down, s1, s2, "swiglu",
                                                    "concat", 1.702, 7.0)
    assert got.dtype == torch.bfloat16
    want = onnx_reference.MoEExperts.eval(
        hidden.float().numpy().astype(ml_dtypes.bfloat16), ids.numpy(), routing.numpy(), q1.view(torch.uint8).numpy(),
        q2.view(torch.uint8).numpy(), None, None, s1.numpy(), s2.numpy(), activation=0, gate_up_layout="concat",
        alpha=1.702, limit=7.0)
    assert _relative_error(got.float().numpy(), want.astype(np.float32)) < 5e-3  # 0 in the runs made
    dense = moe_experts.reference(hidden.float(), ids, routing, moe_experts_fp8.dequantize(q1, s1),
                                  moe_experts_fp8.dequantize(q2, s2))
    assert _relative_error(got.float().numpy(), dense.numpy()) > 1e-2  # the activations were quantized


def test_real_builder_builds_the_fused_fp8_form(fused):
    """TensorRT for RTX's parser and builder with the C++ plugins (libet_trt_plugin.so) take the FP8 MoEExperts node
    (e4m3 weights as kFP8, float32 scales) for both FP8 targets; test_real_builder.py builds the example policy's."""
    rtx = tensorrt_rtx_or_skip()
    contents = fused[3]
    for target in FP8_TARGETS:
        plan = onnx_build.parse_and_build(rtx, contents, target).plan
        assert built_target(plan) == int(target.removeprefix("sm_").removesuffix("a"))
        assert serialized_group_sizes(plan) == [0]  # one MoEExperts plugin, weights not INT4
        assert serialized_kernel_images_ids(plan) == [hashlib.sha256(b"".join(k.image.bytes() for k in
                                                                              contents.kernels)).digest()]


def test_inspect_shows_the_fused_fp8_form(fused, tmp_path, capsys):
    pte = tmp_path / "fp8.pte"
    pte.write_bytes(fused[1].to_executorch().buffer)
    assert cli.main(["-q", "inspect", str(pte)]) == 0
    out = capsys.readouterr().out
    assert "FP8 experts: 1 MoEExperts, weights 36.0 KiB e4m3 + 3.5 KiB scales: node_moe_experts_fp8" in out
    assert "MoE blocks: 1 of 1 fused" in out
    assert "FP8 weights (e4m3, a float32 scale per output channel)" in out


# ---- weights the export cannot quantize ----------------------------------------------------------------------------
class _ComputedWeights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(4, 40, 64, dtype=torch.bfloat16))

    def forward(self, a, offs):
        return torch._grouped_mm(a, (self.w1 * 2).transpose(-2, -1), offs=offs)


def test_weights_computed_at_run_time_stay_bf16_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        low = lower_to_onnx(_export(_ComputedWeights()), FP8)
    assert low.grouped_mms == [GroupedMMUse("bf16", True, "dense")]
    (node,) = [n for n in low.onnx.graph.node if n.op_type == "GroupedMM"]
    assert len(node.input) == 3
    assert "GroupedMM grouped_mm" in caplog.text and "computed at run time" in caplog.text


def test_non_finite_weights_are_refused_by_name():
    model = _Experts()
    with torch.no_grad():
        model.w2[1, 2, 3] = float("nan")
    with pytest.raises(LoweringError, match="weights 'w2': the weights hold inf or NaN"):
        lower_to_onnx(_export(model), FP8)


def test_example_policy_accuracy_against_bf16():
    """Measured (benchmarks/fp8_accuracy.py, tokens 2/16/64/512, seeds 0-2): each GroupedMM 0.0349-0.0367
    worst, the policy output 0.0123 worst (0.0085 mean). Bounds: 1.35x and 1.6x those."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fp8_accuracy

    result = fp8_accuracy.measure(tokens=(16, 512), seeds=(1,))
    assert len(result["grouped_mm"]) == 4  # every decoder GroupedMM ran in FP8
    for name, error in result["grouped_mm"].items():
        assert 0.01 < error < 0.05, name  # FP8 rounding shows (it was applied) and stays bounded
    assert max(result["policy"]) < 0.02


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["MoEExperts", "GroupedMM"])
def test_example_policy_exports_with_fp8_decoder_experts(tmp_path, capsys, fused):
    """The example policy's decoder with FP8 experts: its two MoE blocks as FP8 MoEExperts nodes (fused_experts on,
    the default), which compute the decoder with its dequantized FP8 weights within the activations' e4m3 rounding; or
    (fused_experts off) as FP8 GroupedMMs, each down GEMM taking its gate+up output. inspect says which."""
    import tomllib

    sys.path.insert(0, str(REPO))
    from examples import moe_policy

    recipe = tomllib.loads((REPO / "examples" / "recipe.toml").read_text())
    recipe["parts"]["decoder"].update(expert_precision="fp8", kernel_archs=["sm_90a"], fused_experts=fused)
    recipe["default"]["engine_build"] = "never"  # the velocity part's engines: not this test's subject
    edge = to_edge_transform_and_lower(moe_policy.export_policy(), partitioner=[TensorRTPartitioner(recipe)])
    by_part = {contents.part: (program, contents) for program, contents in delegated_parts(edge)}
    program, contents = by_part["decoder"]
    decoder = onnx.load_from_string(contents.onnx)
    assert not fp8_grouped_mms(onnx.load_from_string(by_part["velocity"][1].onnx))
    pte = tmp_path / "policy.pte"
    pte.write_bytes(edge.to_executorch().buffer)
    assert cli.main(["-q", "inspect", str(pte)]) == 0
    out = capsys.readouterr().out
    assert "FP8 experts: none (0 GroupedMM" in out  # the velocity part's block: fused, bf16
    assert "MoE blocks: 1 of 1 fused" in out
    if not fused:
        assert [e["swiglu"] for e in fp8_grouped_mms(decoder)] == [False, True] * 2  # each layer's down GEMM
        assert {k.weight_format for k in contents.kernels} == {"fp8"}
        assert {"quantize_rows_swiglu", "quantize_rows_swiglu_whole", "quantize_rows_swiglu_any"} <= {
            k.variant for k in contents.kernels}  # for its fused down GEMMs
        assert "FP8 experts: 4 of 4 GroupedMM" in out and "MoE blocks: 0 of 2 fused" in out
        assert out.count("GroupedMM: fused_experts = false") == 2
        assert out.count("SwiGLU of its input fused") == 2
        return
    assert len(fp8_moe_experts(decoder)) == 2 and not fp8_grouped_mms(decoder)
    assert {(k.kernel, k.weight_format) for k in contents.kernels if k.weight_format != "fp8"} == {
        ("moe_combine", "dense")}
    assert "FP8 experts: 2 MoEExperts, weights" in out and "MoE blocks: 2 of 2 fused" in out
    assert out.count("FP8 weights (e4m3, a float32 scale per output channel)") == 2
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    twin = _dequantized_experts(program)
    for tokens in (4, 33):
        inputs = [torch.randn(concrete_shape(spec, tokens)) for spec in contents.inputs]
        got = onnx_reference.evaluator(model).run(None, {s.name: x.numpy() for s, x in zip(contents.inputs, inputs)})
        for value, want in zip(got, run_partition_float32(twin, inputs)):
            assert _relative_error(value, want.numpy()) < 4e-2
