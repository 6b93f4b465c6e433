"""Whole tiny models of the transformers families issues 34 and 35 held out, unmodified, exported through
to_edge_transform_and_lower with TensorRTPartitioner: each is ONE partition with nothing left to ExecuTorch,
its ONNX matches the partition and the module run eagerly in float32 (onnxruntime, dense GroupedMM), and
NVIDIA's own parser and builder (TensorRT for RTX) build it for sm_80, as `et-trt check --build` does.

- DeepSeek-V2: a complex-number rotary embedding (partitioner/complex_pairs.py).
- Qwen3-VL-MoE's text model: step-3 slice writes of its interleaved rotary sections (slice_scatter).
- Granite-MoE-hybrid: mamba2 (depthwise conv1d, softplus, a chunked scan over a padded token count).
- Qwen3-Next: gated delta-net (conv1d, torch.eye, a chunked delta rule) beside gated attention.
One export per family, shared by its tests. The two chunked families are exported with a static token count:
torch.export refuses a Dim range for their chunking (it proves no guard for every size) and takes only
Dim.DYNAMIC, which costs minutes more here; tests/test_partition_sizes.py lowers their padded chunking form
with a dynamic count. Qwen3-Next's delta rule runs with chunks of 8 instead of its fixed 64 (the same
function, a shorter unrolled loop inside each chunk: 7 steps instead of 63) to keep the export cheap.
"""

from __future__ import annotations

import functools

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.engines import onnx_build
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import assert_onnx_matches_partition, delegated_parts
from support.nvidia_builders import tensorrt_rtx_or_skip
from support.onnxruntime_checks import assert_onnx_matches_module, random_input, run_onnxruntime

pytest.importorskip("transformers", reason="the transformers model tests need transformers (the [test] extra)")
pytest.importorskip("onnxruntime", reason="the ONNX numerics run through onnxruntime")

RECIPE = {"default": {"grouped_gemm_kernel": False, "kernel_archs": ["sm_80"], "engine_build": "never"}}
PARTITION_TOLERANCE = dict(rtol=1e-3, atol=1e-3)
STATIC_TOKENS = 7
DYNAMIC_TOKENS = (1, 9, 64)
# family -> dynamic token count (Dim("tokens", min=1, max=64)) or the static one
FAMILIES = {"deepseek_v2": True, "qwen3_vl_moe": True, "granitemoehybrid": False, "qwen3_next": False}


def _short_delta_rule_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling

    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule",
                        functools.partial(modeling.torch_chunk_gated_delta_rule, chunk_size=8))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(module, dynamic, edge program manager) of one family's whole model, lowered once."""
    name, dynamic = request.param, FAMILIES[request.param]
    torch.manual_seed(list(FAMILIES).index(name))
    with pytest.MonkeyPatch.context() as monkeypatch:
        if name == "qwen3_next":
            _short_delta_rule_chunks(monkeypatch)
        module = moe_models.bf16(moe_models.HFCausalLM(name))
        ids = torch.randint(0, moe_models.HF_VOCAB, (1, 8 if dynamic else STATIC_TOKENS))
        dims = ({1: torch.export.Dim("tokens", min=1, max=64)},) if dynamic else None
        with torch.no_grad():
            exported = torch.export.export(module, (ids,), dynamic_shapes=dims)
        edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(RECIPE)])
        yield module, dynamic, edge


def test_the_whole_model_is_one_partition(family):
    _, _, edge = family
    outside = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"
               and n.target is not torch.ops.higher_order.executorch_call_delegate
               and getattr(n.target, "__name__", "") != "getitem"]
    assert outside == []
    assert len(delegated_parts(edge)) == 1


def test_the_onnx_matches_pytorch(family):
    module, dynamic, edge = family
    ((program, contents),) = delegated_parts(edge)
    for tokens in DYNAMIC_TOKENS if dynamic else (STATIC_TOKENS,):
        assert_onnx_matches_partition(program, contents, tokens, run_onnx=run_onnxruntime,
                                      random_input=random_input, **PARTITION_TOLERANCE)
    assert_onnx_matches_module(module, contents, DYNAMIC_TOKENS[-1] if dynamic else STATIC_TOKENS)


def test_the_real_builder_builds_it(family):
    _, _, edge = family
    ((_, contents),) = delegated_parts(edge)
    assert len(onnx_build.parse_and_build(tensorrt_rtx_or_skip(), contents, "sm_80").plan) > 0
