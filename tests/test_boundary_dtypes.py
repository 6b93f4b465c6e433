"""float64 and int64 the way TensorRT users expect (issue 31, item 2).

float64: TensorRT has none. With truncate_double (the default, as Torch-TensorRT's), a partition's float64
ops compute in float32, each logged with its source line; float64 at a partition's edge is cast on ExecuTorch,
so blobs only carry TensorRT types (the C++ reader refuses a float64 IO spec: blob_reader_test.cc). Off, the
float64 ops stay on ExecuTorch with the reason. int64: NVIDIA's parser keeps int64 inputs and outputs as INT64
(its "Make sure input X has Int64 binding"), which is how the runtime binds them; the build check fails where
a network's IO type differs from the blob's spec."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import onnx
import pytest
import torch

from executorch.exir import to_edge_transform_and_lower

from et_trt_backend import op_support
from et_trt_backend.engines import onnx_build
from et_trt_backend.op_support import aten_overload
from et_trt_partitioner import TensorRTPartitioner
from support import op_checks
from support.lowering import delegated_parts
from support.nvidia_builders import tensorrt_rtx_or_skip


def _timestep_embedding(t: torch.Tensor, width: int) -> torch.Tensor:
    """A sinusoidal timestep embedding computed in float64, as pi0's and SmolVLA's flow-matching heads do:
    periods spread geometrically from 4e-3 to 4, the float32 times scaled by float64 frequencies."""
    periods = 4e-3 * 1000.0 ** torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64)
    phases = t[:, None] * (2 * math.pi / periods)[None, :]
    return torch.cat([phases.sin(), phases.cos()], dim=1)


class _ActionHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, inputs):
        return (self.proj(_timestep_embedding(inputs["t"], 16).to(torch.float32)) * inputs["x"],)


def _inputs() -> dict[str, torch.Tensor]:
    return {"t": torch.rand(3), "x": torch.randn(3, 8)}


def _elem_types(model: onnx.ModelProto) -> set[int]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    return {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]} | \
        {t.data_type for t in graph.initializer}


def test_float64_timestep_embedding_delegates_whole_in_float32(caplog):
    module = _ActionHead()
    with caplog.at_level(logging.INFO, logger="et_trt_backend.lowering.precision"):
        whole = op_checks.export_whole(module, _inputs())
    assert onnx.TensorProto.DOUBLE not in _elem_types(whole.model)
    narrowed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("truncate_double: aten_")]
    assert any("aten_sin_default at " in m and "test_boundary_dtypes.py" in m for m in narrowed), narrowed
    # Against the module itself (its embedding in float64): the float32 phases reach 2*pi/4e-3 * t ~ 1571 rad,
    # and their rounding (2^-24 relative, a few times over) bounds the difference.
    inputs = _inputs()
    with torch.no_grad():
        (expected,) = module(inputs)
    (got,) = op_checks.run_onnx(whole, inputs)
    phase_error = 1571 * 2.0**-24 * 4
    bound = phase_error * np.abs(module.proj.weight.detach().numpy()).sum(1).max() * inputs["x"].abs().max().item()
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=bound)
    op_checks.assert_builds(tensorrt_rtx_or_skip(), whole, targets=("sm_80",))


class _Float64Boundary(torch.nn.Module):
    def forward(self, x):  # float64 in, float64 out
        return (x * 2).sin()


def _outside_ops(edge) -> list[str]:
    return [str(aten_overload(n.target)) for n in edge.exported_program().graph.nodes if n.op == "call_function"
            and "call_delegate" not in str(n.target) and "getitem" not in str(n.target)]


def test_float64_inputs_and_outputs_are_cast_on_executorch():
    exported = torch.export.export(_Float64Boundary(), (torch.randn(4, dtype=torch.float64),))
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(op_checks.RECIPE)])
    assert _outside_ops(edge) == ["dim_order_ops._to_dim_order_copy.default"] * 2  # float64 -> 32, 32 -> 64
    (contents,) = [c for _, c in delegated_parts(edge)]
    assert [s.dtype for s in contents.inputs + contents.outputs] == [torch.float32, torch.float32]
    x = torch.randn(4, dtype=torch.float64)
    (got,) = op_checks.run_onnx(op_checks.Whole(contents, [0], [0]), {"x": x})
    np.testing.assert_allclose(got, (x * 2).sin().numpy(), rtol=1e-6, atol=1e-6)


def test_without_truncate_double_float64_ops_stay_on_executorch_with_the_reason():
    exported = torch.export.export(_ActionHead(), (_inputs(),))
    recipe = {"default": {**op_checks.RECIPE["default"], "truncate_double": False}}
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe)])
    assert {"aten.sin.default", "aten.cos.default", "aten.cat.default"} <= set(_outside_ops(edge))
    sin = next(n for n in exported.run_decompositions({}).graph.nodes if n.target is torch.ops.aten.sin.default)
    assert "truncate_double = true" in op_support.unsupported_reason(sin, truncate_double=False)
    assert op_support.unsupported_reason(sin, truncate_double=True) is None


class _Int64Boundary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, inputs):  # int64 ids in, int64 argmax out
        rows = self.table(inputs["ids"])
        return rows, rows.argmax(-1)


def test_int64_inputs_and_outputs_are_bound_as_int64():
    rtx = tensorrt_rtx_or_skip()
    module = _Int64Boundary()
    whole = op_checks.export_whole(module, {"ids": torch.randint(0, 10, (2, 5))})
    assert torch.int64 in [s.dtype for s in whole.contents.inputs] and \
        torch.int64 in [s.dtype for s in whole.contents.outputs]
    onnx_build.parse_and_build(rtx, whole.contents, "sm_80")  # the network's IO types are the specs'
    ids = torch.randint(0, 10, (2, 5))
    got = op_checks.run_onnx(whole, {"ids": ids})
    for out, ref, name in zip(got, op_checks.float64_results(module, {"ids": ids}), ("rows", "argmax")):
        op_checks.assert_close(out, ref, name, rtol=1e-6, atol=1e-6)
    # An IO spec the network does not have (int32 where the parser kept INT64) fails the build check.
    wrong = dataclasses.replace(whole.contents, inputs=[dataclasses.replace(s, dtype=torch.int32)
                                                         for s in whole.contents.inputs])
    with pytest.raises(onnx_build.BuildFailed, match=r"'inputs_ids': the network's is int64, the IO spec's "
                       "int32"):
        onnx_build.parse_and_build(rtx, wrong, "sm_80")
