"""precision: the recipe's dtype is the one the ONNX carries (et_trt_backend/lowering/precision.py).

The rule: the model's bf16/fp16 becomes the requested dtype, its float32 islands
(router softmax, norm variance, SiLU's float32 math, float expert ids) stay
float32, precision fp32 makes everything float32, and the partition's inputs
and outputs keep ExecuTorch's dtypes (casts at the boundary).

Numerics: the fp16 ONNX is run as TensorRT receives it (numpy fp16 arithmetic in
onnx's reference evaluator, GroupedMM accumulating in float32 as the kernel
does) and compared, before its output's boundary cast, with the same PyTorch
model converted with `.half()` and run eagerly, and with it in float32; fresh
random inputs.
"""

from __future__ import annotations

import collections
import logging

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch

from et_trt_backend.onnx_analysis import onnx_precision
from et_trt_backend.lowering import LoweringError, lower_to_onnx
from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import external_data
from et_trt_backend.serialization.pte import read_partitions
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models, onnx_reference
from support.lowering import assert_onnx_matches_partition, lower, lower_program

_NAMES = {onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.FLOAT: "fp32"}
_FP16_ULP = 2.0**-10  # relative spacing of fp16 values


def _ops_by_input_type(model: onnx.ModelProto) -> collections.Counter:
    """(op type, float type of its first input) -> how many nodes."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    return collections.Counter((n.op_type, _NAMES.get(types.get(n.input[0]), "other")) for n in graph.node)


def _boundary_casts(model: onnx.ModelProto) -> tuple[int, int]:
    """(casts of a graph input, casts producing a graph output): the partition boundary."""
    graph = model.graph
    inputs, outputs = {i.name for i in graph.input}, {o.name for o in graph.output}
    casts = [n for n in graph.node if n.op_type == "Cast"]
    return sum(n.input[0] in inputs for n in casts), sum(n.output[0] in outputs for n in casts)


def _run_fp16(model: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    """The ONNX's one output in fp16, before its cast back to the partition's output dtype."""
    (cast,) = [n for n in model.graph.node if n.output[0] == model.graph.output[0].name]
    assert cast.op_type == "Cast", "the output leaves through a boundary cast"
    numpy_feeds = {name: value.float().numpy().astype(ml_dtypes.bfloat16) for name, value in feeds.items()}
    (got,) = onnx_reference.evaluator(model).run([cast.input[0]], numpy_feeds)
    assert got.dtype == np.float16
    return torch.from_numpy(got.astype(np.float32))


def _assert_fp16_accuracy(got: torch.Tensor, half: torch.Tensor, full: torch.Tensor) -> dict[str, float]:
    """got (the ONNX in fp16) is as close to the float32 result as PyTorch fp16 is, within fp16's
    spacing at the output's scale; returns the max errors."""
    ulp = full.abs().max().item() * _FP16_ULP
    errors = {"onnx_vs_fp32": (got - full).abs().max().item(), "torch_fp16_vs_fp32": (half - full).abs().max().item(),
              "onnx_vs_torch_fp16": (got - half).abs().max().item(), "fp16_ulp": ulp}
    assert errors["onnx_vs_fp32"] <= 4 * ulp, errors
    assert errors["onnx_vs_torch_fp16"] <= 3 * ulp, errors
    return errors


# ---- the rule, on small programs --------------------------------------------------------------
def test_fp16_converts_the_bf16_model_and_keeps_its_float32_islands():
    model = moe_models.bf16(moe_models.GroupedMoE(experts=4, shared=True))
    recipe = {"default": {"precision": "fp16", "kernel_archs": ["sm_90a"]}}
    (_, contents), = lower_program(moe_models.export(model), TensorRTPartitioner(recipe))
    onnx_model = external_data.onnx_with_weights(contents.onnx, contents.weights)
    assert [s.dtype for s in contents.inputs + contents.outputs] == [torch.bfloat16] * 2  # ExecuTorch's dtypes
    assert _boundary_casts(onnx_model) == (1, 1)
    precision = onnx_precision(onnx_model)
    assert "bf16" not in precision["weights"] and "bf16" not in precision["computed"]
    assert {k.dtype for k in contents.kernels} == {"fp16"}
    ops = _ops_by_input_type(onnx_model)
    assert ops[("MoEExperts", "fp16")] == 1  # the routed experts, fused (their SwiGLU inside)
    assert ops[("Gemm", "fp16")] + ops[("MatMul", "fp16")] == 3  # router linear + shared expert, in fp16
    assert ops[("Softmax", "fp32")] == 1  # the router's .float() softmax stays float32
    assert ops[("Sigmoid", "fp32")] == 1  # the shared expert's SiLU in float32 math, as eager PyTorch does it
    for tokens in (2, 7, 100):
        x = torch.randn(tokens, 32).to(torch.bfloat16)
        got = _run_fp16(onnx_model, {contents.inputs[0].name: x})
        with torch.no_grad():
            half, full = model.half()(x.half()).float(), model.float()(x.float())
        _assert_fp16_accuracy(got, half, full)


def test_fp32_makes_every_float_tensor_float32(caplog):
    options = CompileOptions(precision="fp32", kernel_archs=("sm_90a",))
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering"):
        (program, contents), = lower(moe_models.RoutingMoE("index_add").eval(), 16, True, options)
    model = onnx.ModelProto.FromString(contents.onnx)
    assert [s.dtype for s in contents.inputs + contents.outputs] == [torch.bfloat16] * 2
    assert _boundary_casts(model) == (1, 1)
    precision = onnx_precision(model)
    assert set(precision["weights"]) == set(precision["computed"]) == {"fp32"}
    assert "GroupedMM" not in {n.op_type for n in model.graph.node} and contents.kernels == []
    assert "lowered densely (no grouped-GEMM kernel for torch.float32)" in caplog.text
    for tokens in (1, 100):
        assert_onnx_matches_partition(program, contents, tokens)  # float32 tolerances


class _Scaled(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), scale, dtype=torch.bfloat16))

    def forward(self, x):
        return x * self.w


def test_a_float32_model_stays_float32_and_the_export_says_so(caplog):
    program = torch.export.export(_Scaled(0.5).float(), (torch.randn(3, 4),))
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering"):
        lowered = lower_to_onnx(program, CompileOptions(precision="fp16"))
    assert set(onnx_precision(lowered.onnx)["computed"]) == {"fp32"}
    assert 'precision = "fp16": this partition has no bf16/fp16 tensor, only float32, which is kept' in caplog.text
    assert "model.to(torch.float16)" in caplog.text


def test_a_weight_beyond_fp16_range_is_refused_naming_it():
    program = torch.export.export(_Scaled(1e5), (torch.randn(3, 4).bfloat16(),))
    with pytest.raises(LoweringError, match=r"precision = \"fp16\" cannot hold 'w' \(largest magnitude 9.984e\+04\): "
                       r"the values overflow to inf .*precision = \"bf16\" or \"fp32\""):
        lower_to_onnx(program, CompileOptions(precision="fp16"))
    lower_to_onnx(program, CompileOptions(precision="fp32"))  # fp32 holds it


def test_a_scalar_beyond_fp16_range_is_a_warning_naming_its_line(caplog):
    class MaskFill(torch.nn.Module):
        def forward(self, x):
            return x.masked_fill(x < 0, -1e9)  # the line the warning names

    program = torch.export.export(MaskFill(), (torch.randn(3, 4).bfloat16(),))
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering"):
        lower_to_onnx(program, CompileOptions(precision="fp16"))
    assert "test_precision.py" in caplog.text and "x.masked_fill(x < 0, -1e9)" in caplog.text
    assert "the constant -1e+09 is beyond fp16's range (65504) and becomes -inf in fp16" in caplog.text


# ---- the example policy with its recipe (velocity fp16, decoder bf16) ---------------------------
@pytest.fixture(scope="module")
def example_parts(example_pte):
    """part -> blob contents of the example as `et-trt export` wrote it with its recipe (the test run's shared
    export, conftest.py)."""
    return {p.contents.part: p.contents for p in read_partitions(example_pte.read_bytes(), data_dir=example_pte.parent)}


@pytest.mark.slow
def test_example_velocity_is_fp16_throughout(example_parts):
    velocity = example_parts["velocity"]
    model = onnx.ModelProto.FromString(velocity.onnx)
    assert velocity.options.precision == "fp16"
    assert _boundary_casts(model) == (3, 1)  # timestep, noisy_actions, context in; the velocity out
    assert onnx_precision(model)["inputs/outputs"] == {"bf16": 4}
    precision = onnx_precision(model)
    assert "bf16" not in precision["weights"] and "bf16" not in precision["computed"]
    ops = _ops_by_input_type(model)
    assert ops[("MoEExperts", "fp16")] == 1  # its MoE block, fused
    assert ops[("Gemm", "fp16")] + ops[("MatMul", "fp16")] == 11
    assert ops[("MatMul", "fp32")] == 1 and ops[("Gemm", "fp32")] == 0  # only the router's .float() linear
    assert {k.dtype for k in velocity.kernels} == {"fp16"}
    # The decoder keeps the model's bf16.
    decoder = example_parts["decoder"]
    assert "fp16" not in onnx_precision(onnx.ModelProto.FromString(decoder.onnx))["computed"]
    assert {k.dtype for k in decoder.kernels} == {"bf16"}


@pytest.mark.slow
def test_example_velocity_matches_pytorch_fp16(example_parts):
    from examples import moe_policy

    velocity = example_parts["velocity"]
    model = external_data.onnx_with_weights(velocity.onnx, velocity.weights)
    (context,) = [s.name for s in velocity.inputs if s.name not in ("timestep", "noisy_actions")]
    head = moe_policy.build_policy().velocity  # the exported policy's weights (seed 0)
    generator = torch.Generator().manual_seed(1)
    for tokens in (2, 100, 512):
        feeds = {"timestep": torch.rand(1, generator=generator),
                 "noisy_actions": torch.randn(moe_policy.HORIZON, moe_policy.ACTION_DIM, generator=generator),
                 context: torch.randn(tokens, moe_policy.HIDDEN, generator=generator)}
        feeds = {name: value.bfloat16() for name, value in feeds.items()}  # what ExecuTorch passes
        args = (feeds["noisy_actions"], feeds["timestep"], feeds[context])
        got = _run_fp16(model, feeds)
        with torch.no_grad():
            half = head.half()(*(a.half() for a in args)).float()
            full = head.float()(*(a.float() for a in args))
        errors = _assert_fp16_accuracy(got, half, full)
        logging.getLogger(__name__).info("velocity fp16, %d context tokens: %s", tokens, errors)
