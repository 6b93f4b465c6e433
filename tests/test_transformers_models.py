"""Whole transformers decoder layers and whole tiny causal LMs of public MoE families, unmodified:
exported through to_edge_transform_and_lower with TensorRTPartitioner, every op delegated, each
partition's ONNX run by onnxruntime and matched against PyTorch in float32, and to_executorch().

Tiny random configs (one layer, hidden 32, bf16, eval; moe_models.HF_FAMILIES says what each family
brings), grouped_mm experts, static and dynamic token counts. The grouped GEMM is lowered in its
dense ONNX form, which onnxruntime runs (the kernel form is a custom op; test_lowering.py and
test_lowering_models.py check it with the reference implementation). A whole model's engine is built at
export where TensorRT for RTX is installed (engine_build "auto"), for one target, the cases taking sm_80 and
sm_120a in turn; a layer's is not: its model holds the same layer, and test_real_builder.py builds each
family's layer in its GroupedMM form. A whole model is lowered as `et-trt export` lowers it, a layer with the
plain to_edge_transform_and_lower call.
"""

from __future__ import annotations

from typing import Iterator

import onnx
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.engines import providers
from et_trt_backend.serialization import blob
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import assert_onnx_matches_partition, delegated_parts
from support.onnxruntime_checks import assert_onnx_matches_module, random_input, run_onnxruntime

pytest.importorskip("transformers", reason="the transformers model tests need transformers (the [test] extra)")
pytest.importorskip("onnxruntime", reason="the ONNX numerics run through onnxruntime")

# Float32 on both sides, but the ONNX exporter folds constant subgraphs (weights times scales, the
# rotary tables of a static token count) in the model's bf16, where the eager float32 reference
# keeps float32: differences up to a bf16 rounding (2**-8 relative) of such a constant. Against
# the partition's float32 twin (constants also computed as written, see test_lowering) they stay
# smaller. A wrong layout or routing gives errors of order one.
PARTITION_TOLERANCE = dict(rtol=1e-3, atol=1e-3)
STATIC_TOKENS = 7
DYNAMIC_TOKENS = (2, 9, 64)  # checked on one dynamic export (range 2..256)


def partition_onnx(edge) -> Iterator[tuple[torch.export.ExportedProgram, blob.BlobContents, onnx.ModelProto]]:
    """(partition program, blob contents, ONNX model) of every delegate of a lowered edge manager:
    the ONNX exactly as the blob carries it, for checks of the ONNX itself."""
    for program, contents in delegated_parts(edge):
        yield program, contents, onnx.ModelProto.FromString(contents.onnx)


def _module(name: str, kind: str) -> torch.nn.Module:
    if kind == "layer":
        return moe_models.bf16(moe_models.HFDecoderLayer(name))
    return moe_models.bf16(moe_models.HFCausalLM(name))


def _example(kind: str, tokens: int) -> torch.Tensor:
    if kind == "layer":
        return torch.randn(1, tokens, moe_models.HF_HIDDEN).to(moe_models.DTYPE)
    return torch.randint(0, moe_models.HF_VOCAB, (1, tokens))


def _outside_delegates(edge) -> list[str]:
    """Ops ExecuTorch would run itself: everything but delegate calls and picking their outputs."""
    return [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"
            and n.target is not torch.ops.higher_order.executorch_call_delegate
            and getattr(n.target, "__name__", "") != "getitem"]


CASES = [(name, kind, dynamic) for name in moe_models.HF_FAMILIES for kind in ("layer", "model")
         for dynamic in (True, False)]
ENGINE_TARGETS = ("sm_80", "sm_120a")


def _engine_target(name: str, kind: str, dynamic: bool) -> str | None:
    """The one target a whole model's engine is built for at export, ENGINE_TARGETS in turn; None for a layer."""
    models = [case for case in CASES if case[1] == "model"]
    return ENGINE_TARGETS[models.index((name, kind, dynamic)) % len(ENGINE_TARGETS)] if kind == "model" else None


def _engines_expected(target: str | None) -> list[int]:
    """The compute capabilities of the engines an export builds for `target` here."""
    try:
        providers.tensorrt_rtx()
    except providers.BuilderUnavailable:
        return []
    return [providers.RTX_TARGETS[target]] if target else []


@pytest.mark.slow
@pytest.mark.parametrize("name, kind, dynamic", CASES,
                         ids=[f"{n}-{k}-{'dynamic' if d else 'static'}" for n, k, d in CASES])
def test_transformers_model_is_delegated_and_matches_pytorch(name, kind, dynamic):
    torch.manual_seed(CASES.index((name, kind, dynamic)))  # fresh inputs per case, reproducible
    module = _module(name, kind)
    dims = ({1: torch.export.Dim("tokens", min=2, max=256)},) if dynamic else None
    with torch.no_grad():
        exported = torch.export.export(module, (_example(kind, 8 if dynamic else STATIC_TOKENS),),
                                       dynamic_shapes=dims)
    assert sum(n.target is torch.ops.aten._grouped_mm.default for n in exported.graph.nodes) == 2

    target = _engine_target(name, kind, dynamic)
    recipe = {"grouped_gemm_kernel": False, **({"kernel_archs": [target]} if target else {"engine_build": "never"})}
    # A whole model is lowered as export() lowers it (the preserved ops in the compile config: a trace fewer), a layer
    # with the README's plain call: each family's layer both ways (test_partitioner.py checks they lower alike).
    whole = kind == "model"
    config = {"compile_config": TensorRTPartitioner.edge_compile_config()} if whole else {}
    edge = to_edge_transform_and_lower(
        exported, partitioner=[TensorRTPartitioner({"default": recipe}, preserved_ops_in_config=whole)], **config)
    assert _outside_delegates(edge) == []
    parts = list(partition_onnx(edge))
    assert parts, "nothing was delegated"
    for program, contents, model in parts:
        assert "GroupedMM" not in {node.op_type for node in model.graph.node}  # dense: onnxruntime runs it
        assert [engine.compute_capability for engine in contents.engines] == _engines_expected(target)
        for tokens in DYNAMIC_TOKENS if dynamic else (STATIC_TOKENS,):
            assert_onnx_matches_partition(program, contents, tokens, run_onnx=run_onnxruntime,
                                          random_input=random_input, **PARTITION_TOLERANCE)
    if len(parts) == 1:
        assert_onnx_matches_module(module, parts[0][1], DYNAMIC_TOKENS[-1] if dynamic else STATIC_TOKENS)
    assert len(edge.to_executorch().buffer) > 0

