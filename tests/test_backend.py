"""preprocess: options -> ONNX -> pre-flight -> kernel images -> engine policy -> blob."""

from __future__ import annotations

import logging

import onnx
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.engine_build import EngineBuildError
from et_trt_backend.serialization import blob
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import lower_program

GPU_REASON = "an NVIDIA GPU is present: an engine may really be built here"


def _moe_program(tokens: int = 6):
    return moe_models.export(moe_models.bf16(moe_models.GroupedMoE(combine="index_add")), tokens=tokens)


def _blobs(recipe) -> list[blob.BlobContents]:
    return [contents for _, contents in lower_program(_moe_program(), TensorRTPartitioner(recipe))]


def test_blob_carries_onnx_io_specs_options_and_kernels():
    recipe = {"default": {"kernel_archs": ["sm_90a"], "optimization_level": 4,
                          "shape_ranges": {"tokens": {"min": 4, "opt": 32, "max": 128}}}}
    (contents,) = _blobs(recipe)
    graph = onnx.ModelProto.FromString(contents.onnx).graph
    assert [s.name for s in contents.inputs] == [i.name for i in graph.input]
    assert [s.name for s in contents.outputs] == [o.name for o in graph.output]
    (x,) = contents.inputs
    assert x.dtype == torch.bfloat16
    tokens = x.dims[0]
    assert (tokens.size, tokens.name, tokens.min, tokens.opt, tokens.max) == (None, "tokens", 4, 32, 128)
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "tokens"
    assert contents.options.optimization_level == 4
    assert contents.part == "default"
    # GroupedMM nodes with trans_b=1, bf16: kernel images for sm_90a plus portable PTX
    assert {(k.dtype, k.format) for k in contents.kernels} >= {("bf16", "cubin"), ("bf16", "ptx")}
    assert {k.arch for k in contents.kernels if k.format == "cubin"} == {"sm_90a"}
    assert contents.producer["triton"] and contents.producer["onnx_opset"] == 18


def test_dense_grouped_mm_needs_no_kernel_images(caplog):
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering"):
        (contents,) = _blobs({"default": {"grouped_gemm_kernel": False}})
    assert contents.kernels == [] and contents.producer["triton"] == ""
    ops = [n.op_type for n in onnx.ModelProto.FromString(contents.onnx).graph.node]
    assert "GroupedMM" not in ops
    assert "lowered densely (grouped_gemm_kernel = false): 4 x the multiply-adds" in caplog.text


# sm_90a only: a target neither TensorRT for RTX (which cannot build for it) nor, without a GPU, TensorRT serves.
NO_BUILDER_HERE = {"grouped_gemm_kernel": False, "kernel_archs": ["sm_90a"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason=GPU_REASON)
def test_engine_auto_without_a_builder_leaves_the_engine_to_the_device(caplog):
    with caplog.at_level(logging.INFO, logger="et_trt_backend.engine_build"):
        (contents,) = _blobs({"default": {**NO_BUILDER_HERE, "engine_build": "auto"}})
    assert contents.engines == [] and contents.producer["tensorrt"] == ""
    assert "the device will build it from the ONNX" in caplog.text
    assert "TensorRT for RTX: kernel_archs (sm_90a) names none of the targets it builds for" in caplog.text
    # Nothing announces a build that does not happen.
    assert "building" not in caplog.text


def test_engine_never_is_not_attempted(caplog):
    with caplog.at_level(logging.INFO, logger="et_trt_backend.engine_build"):
        (contents,) = _blobs({"default": {"grouped_gemm_kernel": False, "engine_build": "never"}})
    assert contents.engines == []
    assert "engine_build = never" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason=GPU_REASON)
def test_engine_always_without_tensorrt_is_a_clear_error():
    recipe = {"default": {**NO_BUILDER_HERE, "engine_build": "always"}}
    with pytest.raises(EngineBuildError, match=r"engine_build = always, but no engine can be built here: .*"
                       r"set engine_build = \"auto\""):
        to_edge_transform_and_lower(_moe_program(), partitioner=[TensorRTPartitioner(recipe)])


@pytest.mark.tensorrt
def test_engine_built_at_export_where_tensorrt_and_a_gpu_exist():
    from et_trt_backend import runtime

    try:
        runtime.load()
    except runtime.RuntimeLoadError as e:
        pytest.skip(f"the et-trt runtime library is not built here: {e}")
    if not torch.cuda.is_available():
        pytest.skip("no NVIDIA GPU here: TensorRT engines are built on the device")
    (contents,) = _blobs({"default": {"kernel_archs": ["sm_90a"], "engine_build": "always"}})
    (engine,) = contents.engines
    assert engine.provider == "tensorrt" and engine.plan
    assert contents.producer["tensorrt"] == engine.tensorrt_version
    assert engine.compute_capability == 10 * torch.cuda.get_device_capability()[0] + \
        torch.cuda.get_device_capability()[1]
