"""Partition -> ONNX: each partition's ONNX matches the PyTorch partition numerically.

The ONNX (GroupedMM run by the contract-4 reference implementation) and the
partition's edge program are both run in float32 (a float32 twin of the bf16
model on each side, same weights), on fresh random inputs, for several token
counts of a dynamic-token export and for a static export, with the grouped-GEMM
kernel form and the dense form.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import sympy
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data

import et_trt_backend
from et_trt_backend.backend import TensorRTBackend  # noqa: F401  (registers the backend by name)
from et_trt_backend.lowering import reference
from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import blob

torch.manual_seed(0)
aten = torch.ops.aten
_PRESERVED = [aten._grouped_mm.default, aten.argsort.stable, aten.histc.default, aten.index_add.default,
              aten.empty_like.default]


class _MoE(torch.nn.Module):
    """Public-code MoE routing: top-k -> argsort/sort -> histc -> cumsum -> _grouped_mm -> combine."""

    def __init__(self, combine: str, dim=32, ffn=32, experts=8, k=2):
        super().__init__()
        self.k, self.experts, self.combine = k, experts, combine
        self.router = torch.nn.Linear(dim, experts, bias=False, dtype=torch.bfloat16)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * ffn, dim, dtype=torch.bfloat16) / dim**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, ffn, dim, dtype=torch.bfloat16) / ffn**0.5)

    def forward(self, x):
        weights, ids = torch.topk(torch.softmax(self.router(x).float(), -1), self.k, dim=-1)
        flat = ids.reshape(-1)
        if self.combine == "index_add":  # torchtitan style
            order = torch.argsort(flat, stable=True)
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        else:  # transformers style: unstable sort, inverse permutation, reshape-and-sum
            _, order = torch.sort(flat)
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = x[order // self.k]
        gate, up = torch._grouped_mm(rows, self.gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        rows = torch._grouped_mm(F.silu(gate) * up, self.down, offs=offs)  # down stored [E, ffn, dim]
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1).to(rows.dtype)
        if self.combine == "index_add":
            return torch.zeros_like(x).index_add(0, order // self.k, rows)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0])
        return rows[inverse].view(x.shape[0], self.k, -1).sum(1)


class _TagAll(Partitioner):
    """Delegates the whole graph as one partition (the partitioner's job, kept minimal here)."""

    def __init__(self, options: CompileOptions):
        super().__init__()
        self._spec = DelegationSpec(et_trt_backend.BACKEND_ID, options.to_compile_specs("moe"))

    def ops_to_not_decompose(self, ep):
        return _PRESERVED, lambda node: True

    def partition(self, ep):
        for node in ep.graph_module.graph.nodes:
            if node.op == "call_function":
                node.meta["delegation_tag"] = "moe"
        tag_constant_data(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags={"moe": self._spec})


def lower(model, tokens: int, dynamic: bool, options: CompileOptions):
    """(edge program, blob contents) of every partition of `model` lowered through preprocess."""
    x = torch.randn(tokens, 32, dtype=torch.bfloat16)
    shapes = ({0: torch.export.Dim("tokens", min=1, max=4096)},) if dynamic else None
    ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
    edge = to_edge_transform_and_lower(ep, partitioner=[_TagAll(options)])
    gm = edge.exported_program().graph_module
    return [(m.original_module, blob.deserialize(m.processed_bytes))
            for name, m in gm.named_children() if name.startswith("lowered_module")]


def run_partition_float32(program: torch.export.ExportedProgram, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The partition's edge program, run in float32 (weights and bf16/fp16 casts upcast)."""
    gm = copy.deepcopy(program.graph_module)
    low = (torch.bfloat16, torch.float16)
    upcast = lambda v: torch.float32 if v in low else v  # noqa: E731
    for node in gm.graph.nodes:
        node.args = torch.utils._pytree.tree_map(upcast, node.args)
        node.kwargs = torch.utils._pytree.tree_map(upcast, node.kwargs)
    gm.recompile()
    sig = program.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    user = iter(inputs)
    args = []
    for spec in sig.input_specs:
        if spec.arg.name in named:
            value = {**program.state_dict, **program.constants}[named[spec.arg.name]]
            args.append(value.float() if value.dtype in low else value)
        else:
            args.append(next(user))
    with torch.no_grad():
        return list(torch.fx.Interpreter(gm).run(*args))


def _shape(spec: blob.TensorSpec, tokens: int) -> list[int]:
    return [d.size if d.size is not None else int(sympy.sympify(d.name).subs("tokens", tokens)) for d in spec.dims]


def assert_onnx_matches_partition(program, contents: blob.BlobContents, tokens: int) -> None:
    model = reference.to_float32(onnx.ModelProto.FromString(contents.onnx))
    inputs = [torch.randn(_shape(spec, tokens)) for spec in contents.inputs]
    expected = run_partition_float32(program, inputs)
    got = reference.evaluator(model).run(None, {s.name: t.numpy() for s, t in zip(contents.inputs, inputs)})
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        assert out.shape == tuple(ref.shape)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("combine", ["index_add", "inverse_permutation"])
@pytest.mark.parametrize("kernel", [True, False], ids=["groupedmm", "dense"])
def test_dynamic_tokens_match_pytorch(combine, kernel):
    options = CompileOptions(grouped_gemm_kernel=kernel, kernel_archs=("sm_90a",))
    (program, contents), = lower(_MoE(combine).eval(), 16, True, options)
    names = [n.op_type for n in onnx.ModelProto.FromString(contents.onnx).graph.node]
    assert ("GroupedMM" in names) == kernel
    assert "TopK" in names and names.count("TopK") == 1  # the router's; the sort is a counting sort
    for tokens in (1, 7, 100, 4096):
        assert_onnx_matches_partition(program, contents, tokens)


def test_static_tokens_match_pytorch():
    options = CompileOptions(grouped_gemm_kernel=False)
    (program, contents), = lower(_MoE("index_add").eval(), 7, False, options)
    assert all(d.size is not None for spec in contents.inputs + contents.outputs for d in spec.dims)
    assert_onnx_matches_partition(program, contents, 7)
