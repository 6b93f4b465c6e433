"""expert_precision = "fp8": an FP8 GroupedMM fed by a SwiGLU takes the gate+up output (activation 1).

The ONNX (onnx_reference runs the fused GroupedMM with its own numpy SwiGLU) is checked against PyTorch
running the unfused graph's reference on fresh random inputs; the forms the fusion must and must not take
are exported from model code written each way.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

from et_trt_backend import preflight, quantization
from et_trt_backend.lowering import GroupedMMUse, lower_to_onnx
from et_trt_backend.options import parse_options
from et_trt_backend.plugin_names import ACTIVATION_ATTRIBUTE
from support import onnx_reference

FP8 = parse_options({"expert_precision": "fp8", "kernel_archs": ["sm_90a"]})
K, HIDDEN, GROUPS = 48, 64, 4


def _chunk(x):
    return x.chunk(2, dim=-1)


def _slices(x):
    return x[:, :K], x[..., K:]


def _negative_slices(x):  # bounds counted from the end, as aten.slice keeps them
    return x[:, :-K], x[:, -K:]


def _split(x):
    return torch.split(x, K, dim=1)


class _Experts(torch.nn.Module):
    """gate+up GEMM, SwiGLU written as `glu`, down GEMM; `also_return_h` reads the SwiGLU a second time."""

    def __init__(self, halves=_chunk, glu=lambda g, u: F.silu(g) * u, also_return_h=False):
        super().__init__()
        self.gate_up = torch.nn.Parameter(torch.randn(GROUPS, 2 * K, HIDDEN, dtype=torch.bfloat16) / HIDDEN**0.5)
        self.down = torch.nn.Parameter(torch.randn(GROUPS, HIDDEN, K, dtype=torch.bfloat16) / K**0.5)
        self.halves, self.glu, self.also_return_h = halves, glu, also_return_h

    def forward(self, a, offs):
        gate, up = self.halves(torch._grouped_mm(a, self.gate_up.transpose(-2, -1), offs=offs))
        h = self.glu(gate, up)
        out = torch._grouped_mm(h, self.down.transpose(-2, -1), offs=offs)
        return (out, h) if self.also_return_h else out


def _lower(model):
    a = torch.randn(24, HIDDEN, dtype=torch.bfloat16)
    offs = torch.tensor([5, 5, 12, 24], dtype=torch.int32)
    exported = torch.export.export(model, (a, offs), dynamic_shapes=({0: torch.export.Dim("rows", max=256)}, None))
    return lower_to_onnx(exported, FP8)


def _activations(model: onnx.ModelProto) -> list[int]:
    nodes = [n for n in model.graph.node if n.op_type == "GroupedMM"]
    return [next((onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == ACTIVATION_ATTRIBUTE), 0)
            for n in nodes]


FUSED = {
    "chunk-silu": {},
    "slices-up-first": {"halves": _slices, "glu": lambda g, u: u * F.silu(g)},
    "split": {"halves": _split},
    "negative-slices": {"halves": _negative_slices},
    "sigmoid-written-out": {"glu": lambda g, u: (g.float() * torch.sigmoid(g.float())).to(g.dtype) * u},
}


@pytest.mark.parametrize("form", FUSED)
def test_swiglu_before_an_fp8_grouped_mm_is_fused_and_matches_pytorch(form):
    model = _Experts(**FUSED[form]).eval()
    low = _lower(model)
    assert _activations(low.onnx) == [0, 1]
    assert low.grouped_mms == [GroupedMMUse("bf16", True, "fp8"), GroupedMMUse("bf16", True, "fp8", swiglu=True)]
    gate_up, down = [n for n in low.onnx.graph.node if n.op_type == "GroupedMM"]
    assert down.input[0] == gate_up.output[0]  # the gate+up output itself, no slice or product between
    assert not [n for n in low.onnx.graph.node if n.op_type in ("Sigmoid", "Slice", "Split", "Mul")]
    assert preflight.check(low.onnx) == []  # the pre-flight rules take the fused form
    session = onnx_reference.evaluator(onnx_reference.to_float32(low.with_weights()))
    w1 = quantization.quantize_weights_fp8(model.gate_up.detach())
    w2 = quantization.quantize_weights_fp8(model.down.detach())
    for rows, offs in ((1, [0, 1, 1, 1]), (24, [5, 5, 12, 24]), (200, [90, 10, 150, 300]), (7, [-3, 2, 9, 4])):
        a = torch.randn(rows, HIDDEN, dtype=torch.bfloat16).float()
        offs = torch.tensor(offs, dtype=torch.int32)
        x = quantization.grouped_mm_fp8_reference(a, *w1, offs)
        expected = quantization.grouped_mm_fp8_reference(quantization.swiglu_rows(x), *w2, offs)
        (got,) = session.run(None, {"a": a.numpy(), "offs": offs.numpy()})
        error = np.linalg.norm(got - expected.numpy()) / np.linalg.norm(expected.numpy())
        assert error < 1e-3, (rows, error)  # float32 SwiGLUs one ulp apart may round an e4m3 value apart


NOT_FUSED = {
    "h-read-twice": {"also_return_h": True},
    "geglu": {"glu": lambda g, u: F.gelu(g) * u},
    "halves-swapped": {"halves": lambda x: _chunk(x)[::-1]},
    "negative-slices-swapped": {"halves": lambda x: _negative_slices(x)[::-1]},
    "negative-slices-overlapping": {"halves": lambda x: (x[:, :-K], x[:, -K - 1:-1])},
    "silu-times-gate": {"glu": lambda g, u: F.silu(g) * g},
}


@pytest.mark.parametrize("form", NOT_FUSED)
def test_other_forms_keep_their_ops(form):
    assert _activations(_lower(_Experts(**NOT_FUSED[form]).eval()).onnx) == [0, 0]


def test_blobs_carry_the_swiglu_row_quantizations_only_where_a_grouped_mm_takes_a_gate_up_output(monkeypatch):
    """backend._kernel_images: the images of each (dtype, layout, weight format) once, the quantize_rows_swiglu
    ones (about 100 KiB an architecture) only for a dtype whose FP8 GroupedMM has activation 1."""
    from types import SimpleNamespace

    from et_trt_backend import backend, kernels
    from et_trt_backend.kernels import aot

    calls = []

    def images(archs, dtype, trans_b, weight_format):
        calls.append((dtype, trans_b, weight_format))
        variants = ["any", *aot.QUANTIZE_VARIANTS] if weight_format == "fp8" else ["any"]
        return [SimpleNamespace(variant=v, dtype=dtype, weight_format=weight_format) for v in variants]

    monkeypatch.setattr(kernels, "grouped_mm_images", images)
    uses = {"plain": GroupedMMUse("bf16", True, "fp8"), "fused": GroupedMMUse("bf16", True, "fp8", swiglu=True),
            "fp16": GroupedMMUse("fp16", True, "fp8"), "dense": GroupedMMUse("bf16", True)}
    for picked, want_swiglu in ((["plain", "plain", "dense"], set()), (["plain", "fused", "fp16"], {"bf16"})):
        calls.clear()
        got, _ = backend._kernel_images(SimpleNamespace(grouped_mms=[uses[p] for p in picked], fused_blocks=[]), FP8)
        assert len(calls) == len(set(calls))  # each form compiled once
        assert {i.dtype for i in got if i.variant.startswith("quantize_rows_swiglu")} == want_swiglu
        assert {i.dtype for i in got if i.variant == "quantize_rows_any"} == {uses[p].dtype for p in picked
                                                                               if uses[p].weight_format == "fp8"}


def test_swiglu_rows_rounds_as_the_exported_ops():
    """quantization.swiglu_rows is what the unfused bf16 graph computes: silu in float32 rounded to bf16, then
    the product rounded; checked against the model's own ops on bf16 inputs."""
    x = torch.randn(300, 2 * K, dtype=torch.bfloat16) * 4
    gate, up = x.chunk(2, dim=-1)
    silu = (gate.float() * torch.sigmoid(gate.float())).to(torch.bfloat16)
    assert torch.equal(quantization.swiglu_rows(x), silu * up)
    with pytest.raises(ValueError, match=r"a gate\+up output is \[rows, 2K\]; got \[3, 5\]"):
        quantization.swiglu_rows(torch.zeros(3, 5))


# transformers' MoE experts (grouped_mm implementation): act_fn(gate) * up, except GPT-OSS's clamped GLU.
HF_SWIGLU = {"mixtral": 1, "qwen2_moe": 1, "qwen3_moe": 1, "olmoe": 1, "deepseek_v3": 1, "gpt_oss": 0}


@pytest.mark.parametrize("name", HF_SWIGLU)
def test_transformers_moe_blocks_fuse_their_swiglu_and_keep_their_results(name, monkeypatch):
    """Unmodified transformers MoE blocks lowered to GroupedMMs (fused_experts off; on, they are FP8 MoEExperts nodes:
    test_lowering_fp8.py): the down GroupedMM takes the gate+up output where the model's
    activation is SwiGLU, and the fused ONNX computes what the unfused one does (the same partition lowered again
    without the fusion; both run by onnx_reference in float32, on the same random tokens)."""
    import copy

    from support import moe_models
    from et_trt_backend.lowering import onnx_export
    from et_trt_backend.serialization import external_data
    from et_trt_partitioner import TensorRTPartitioner
    from support.lowering import concrete_shape, lower_program

    recipe = {"default": {"expert_precision": "fp8", "kernel_archs": ["sm_90a"], "fused_experts": False}}
    x = torch.randn(1, 6, moe_models.HF_HIDDEN).to(moe_models.DTYPE)
    with torch.no_grad():
        exported = torch.export.export(moe_models.hf_moe_block(name), (x,),
                                       dynamic_shapes=({1: torch.export.Dim("tokens", min=1, max=512)},))
    (program, fused), = lower_program(exported, TensorRTPartitioner(recipe))
    monkeypatch.setattr(onnx_export, "fuse_swiglu", lambda program: 0)
    unfused = lower_to_onnx(copy.deepcopy(program), fused.options)  # as preprocess lowers it (on a copy)
    assert _activations(onnx.load_from_string(fused.onnx)).count(1) == HF_SWIGLU[name]
    assert _activations(unfused.onnx).count(1) == 0
    (spec,) = fused.inputs
    tokens = torch.randn(concrete_shape(spec, 40)).float().numpy()
    models = (external_data.onnx_with_weights(fused.onnx, fused.weights), unfused.with_weights())
    results = [onnx_reference.evaluator(onnx_reference.to_float32(model)).run(None, {spec.name: tokens})[-1]
               for model in models]
    error = np.linalg.norm(results[0] - results[1]) / np.linalg.norm(results[1])
    assert error < 1e-3, error
