"""Test helper for ops: several independent ops over shared inputs exported as one module, delegated whole into
one TensorRT partition; that partition's ONNX run by onnxruntime on fresh inputs and compared, op by op, with
the module itself run in float64; and the partition built by NVIDIA's builder (TensorRT for RTX)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
from typing import Callable

import numpy as np
import onnx
import onnxruntime
import torch
from executorch.exir import to_edge_transform_and_lower
from torch.utils import _pytree as pytree

from et_trt_backend.engines import onnx_build
from et_trt_backend.op_support import aten_overload
from et_trt_backend.serialization import blob, external_data
from et_trt_partitioner import TensorRTPartitioner
from support.lowering import delegated_parts

# fp32 ONNX, which the float64 reference checks tightly; no engine at export (the tests build them).
RECIPE = {"default": {"precision": "fp32", "engine_build": "never"}}
BUILD_TARGETS = ("sm_80", "sm_86")


class Ops(torch.nn.Module):
    """Independent ops over one dict of inputs, one result each: `ops` maps a name to f(layers, inputs)."""

    def __init__(self, ops: dict[str, Callable], layers: dict[str, torch.nn.Module] | None = None):
        super().__init__()
        self.names = list(ops)
        self.ops = list(ops.values())
        self.layers = torch.nn.ModuleDict(layers or {})

    def forward(self, inputs: dict[str, torch.Tensor]):
        return tuple(f(self.layers, inputs) for f in self.ops)


@dataclasses.dataclass
class Whole:
    """A program delegated whole: its one partition and how the partition's inputs and outputs map to the
    module's (flattened) inputs and results."""

    contents: blob.BlobContents
    input_of: list[int]  # flat module input feeding each partition input
    output_of: list[int]  # partition output giving each module result

    @property
    def model(self) -> onnx.ModelProto:
        return external_data.onnx_with_weights(self.contents.onnx, self.contents.weights)

    def op_types(self) -> set[str]:
        return {node.op_type for node in self.model.graph.node}


def export_whole(module: torch.nn.Module, inputs: dict[str, torch.Tensor], recipe=None,
                 dynamic_shapes=None) -> Whole:
    """`module(inputs)` exported and lowered with TensorRTPartitioner; fails unless it became exactly one
    partition with no op left to ExecuTorch."""
    with torch.no_grad():
        exported = torch.export.export(module.eval(), (inputs,), dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe or RECIPE)])
    program = edge.exported_program()
    graph = program.graph
    delegates = [n for n in graph.nodes if n.op == "call_function" and "call_delegate" in str(n.target)]
    left = [str(aten_overload(n.target)) for n in graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem and n not in delegates]
    assert len(delegates) == 1 and not left, f"not delegated whole: {len(delegates)} partitions, left: {left}"
    (_, contents), = delegated_parts(edge)
    user_inputs = list(program.graph_signature.user_inputs)
    input_of = [user_inputs.index(arg.name) for arg in delegates[0].args[1:]]
    output_of = [result.args[1] for result in pytree.tree_leaves(graph.output_node().args)]
    return Whole(contents, input_of, output_of)


def run_onnx(whole: Whole, inputs: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """The partition's ONNX run by onnxruntime; its results in the module's order."""
    flat = pytree.tree_leaves(inputs)
    session = onnxruntime.InferenceSession(whole.model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {spec.name: flat[i].to(spec.dtype).numpy() for spec, i in zip(whole.contents.inputs, whole.input_of)}
    outputs = session.run(None, feeds)
    return [outputs[i] for i in whole.output_of]


def float64_results(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The module's results with its weights and floating inputs in float64."""
    twin = copy.deepcopy(module).double()
    as_double = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return pytree.tree_leaves(twin(as_double))


def assert_close(got: np.ndarray, expected: torch.Tensor, label: str, rtol: float, atol: float) -> None:
    assert got.shape == tuple(expected.shape), f"{label}: shape {got.shape}, PyTorch {tuple(expected.shape)}"
    if expected.is_floating_point():
        np.testing.assert_allclose(got.astype(np.float64), expected.numpy(), rtol=rtol, atol=atol, err_msg=label)
    else:
        np.testing.assert_array_equal(got, expected.numpy(), err_msg=label)


def assert_builds(rtx, whole: Whole, targets=BUILD_TARGETS) -> None:
    """NVIDIA's parser takes the partition and its builder builds it for every target (else BuildFailed, with
    the parser's and builder's messages)."""
    for target in targets:
        assert len(onnx_build.parse_and_build(rtx, whole.contents, target).plan) > 1000


@dataclasses.dataclass
class Family:
    """Ops exported together: `ops` maps a name to f(layers, inputs); `inputs(batch)` draws fresh inputs, each
    with the batch first where `dynamic_batch` (then exported over a dynamic batch and checked at batch 1
    and 3; else `batch` is ignored)."""

    ops: dict[str, Callable]
    layers: dict[str, torch.nn.Module]
    inputs: Callable[[int], dict[str, torch.Tensor]]
    dynamic_batch: bool = False

    @functools.cached_property
    def module(self) -> Ops:
        return Ops(self.ops, self.layers).eval()

    @functools.cached_property
    def lowered(self) -> Whole:
        inputs = self.inputs(2)
        batch = torch.export.Dim("batch", min=1, max=8)
        shapes = ({name: {0: batch} for name in inputs},) if self.dynamic_batch else None
        return export_whole(self.module, inputs, dynamic_shapes=shapes)

    @functools.cached_property
    def results(self) -> list[tuple[list[np.ndarray], list[torch.Tensor]]]:
        """(ONNX results, float64 results) of each draw of fresh inputs."""
        runs = []
        for batch in (1, 3) if self.dynamic_batch else (1,):
            inputs = self.inputs(batch)
            runs.append((run_onnx(self.lowered, inputs), float64_results(self.module, inputs)))
        return runs

    def assert_op_matches_float64(self, name: str, rtol: float = 1e-5, atol: float = 1e-5) -> None:
        index = self.module.names.index(name)
        for got, expected in self.results:
            assert_close(got[index], expected[index], name, rtol, atol)
