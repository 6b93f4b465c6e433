"""expert_precision = "fp8": GroupedMMs with constant weights lower to the FP8 GroupedMM.

The ONNX (its FP8 GroupedMM run by onnx_reference's numpy/ml_dtypes form) is checked against PyTorch
running the contract's reference (et_trt_backend/quantization.py) on fresh random inputs; the FP8
weights are checked bit for bit, in the ONNX and after the blob's round trip through named data.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from et_trt_backend import quantization
from et_trt_backend.lowering import GroupedMMUse, LoweringError, lower_to_onnx
from et_trt_backend.onnx_analysis import fp8_grouped_mms
from et_trt_backend.options import parse_options
from et_trt_backend.serialization import blob, external_data
from et_trt_partitioner import cli
from support import onnx_reference
from support.lowering import delegated_parts

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
def test_example_policy_exports_with_fp8_decoder_experts(tmp_path, capsys):
    import tomllib

    from executorch.exir import to_edge_transform_and_lower

    from et_trt_partitioner import TensorRTPartitioner

    sys.path.insert(0, str(REPO))
    from examples import moe_policy

    recipe = tomllib.loads((REPO / "examples" / "recipe.toml").read_text())
    recipe["parts"]["decoder"].update(expert_precision="fp8", kernel_archs=["sm_90a"])
    edge = to_edge_transform_and_lower(moe_policy.export_policy(), partitioner=[TensorRTPartitioner(recipe)])
    by_part = {contents.part: contents for _, contents in delegated_parts(edge)}
    decoder = onnx.load_from_string(by_part["decoder"].onnx)
    assert [e["swiglu"] for e in fp8_grouped_mms(decoder)] == [False, True] * 2  # each layer's down GEMM
    assert {k.weight_format for k in by_part["decoder"].kernels} == {"fp8"}
    assert {"quantize_rows_swiglu", "quantize_rows_swiglu_whole", "quantize_rows_swiglu_any"} <= {
        k.variant for k in by_part["decoder"].kernels}  # for its fused down GEMMs
    assert not fp8_grouped_mms(onnx.load_from_string(by_part["velocity"].onnx))
    pte = tmp_path / "policy.pte"
    pte.write_bytes(edge.to_executorch().buffer)
    assert cli.main(["-q", "inspect", str(pte)]) == 0
    out = capsys.readouterr().out
    # The velocity part's block is fused (MoEExperts); the decoder's stay FP8 GroupedMMs, and inspect says why.
    assert "FP8 experts: 4 of 4 GroupedMM" in out and "FP8 experts: none (0 GroupedMM" in out
    assert "MoE blocks: 0 of 2 fused" in out and "MoE blocks: 1 of 1 fused" in out
    assert out.count('GroupedMM: expert_precision = "fp8": MoEExperts has no FP8 weights yet') == 2
    assert out.count("SwiGLU of its input fused") == 2
