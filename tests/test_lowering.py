"""Partition -> ONNX: each partition's ONNX matches the PyTorch partition numerically.

The ONNX (GroupedMM run by the contract-4 reference implementation) and the
partition's edge program are both run in float32 (a float32 twin of the bf16
model on each side, same weights), on fresh random inputs, for several token
counts of a dynamic-token export and for a static export, with the grouped-GEMM
kernel form and the dense form.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import sympy
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner

from et_trt_backend.backend import EtTrtBackend  # noqa: F401  (registers the backend by name)
from et_trt_backend.lowering import LoweringError, lower_to_onnx, reference
from et_trt_backend.options import CompileOptions, ShapeRange
from et_trt_backend.serialization import blob
from et_trt_partitioner import TensorRTPartitioner

torch.manual_seed(0)


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


def lower(model, tokens: int, dynamic: bool, options: CompileOptions):
    """(edge program, blob contents) of every partition of `model` lowered through preprocess."""
    x = torch.randn(tokens, 32, dtype=torch.bfloat16)
    shapes = ({0: torch.export.Dim("tokens", min=1, max=4096)},) if dynamic else None
    recipe = {"default": {k: v for k, v in options.to_json().items() if k != "shape_ranges"}}
    return lower_program(torch.export.export(model, (x,), dynamic_shapes=shapes), TensorRTPartitioner(recipe))


def lower_program(ep: torch.export.ExportedProgram, partitioner: Partitioner):
    """(edge program, blob contents) of every partition of `ep` lowered through preprocess."""
    return delegated_parts(to_edge_transform_and_lower(ep, partitioner=[partitioner]))


def delegated_parts(edge):
    """(edge program, blob contents) of every delegate in a lowered edge manager."""
    gm = edge.exported_program().graph_module
    return [(m.original_module, blob.deserialize(m.processed_bytes))
            for name, m in gm.named_children() if name.startswith("lowered_module")]


class _Float32Twin(torch.fx.Interpreter):
    """Runs a graph in float32: bf16/fp16 tensors entering an op are upcast, casts to them become
    float32. Ops on constants only (weights, lifted constants) run as written, the way the ONNX
    exporter folds them into initializers before the ONNX twin is upcast."""

    LOW = (torch.bfloat16, torch.float16)

    def __init__(self, gm, constant_nodes):
        super().__init__(gm)
        self.constant_nodes = constant_nodes

    def run_node(self, node):
        if node.op != "call_function" or node in self.constant_nodes:
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        upcast = lambda v: torch.float32 if v in self.LOW else (  # noqa: E731
            v.float() if isinstance(v, torch.Tensor) and v.dtype in self.LOW else v)
        args, kwargs = torch.utils._pytree.tree_map(upcast, (args, kwargs))
        return node.target(*args, **kwargs)


def _tensor_user_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """The partition's tensor arguments, in order: what the blob's inputs list."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [name for name in program.graph_signature.user_inputs
            if isinstance(placeholders[name].meta["val"], torch.Tensor)]


def run_partition_float32(program: torch.export.ExportedProgram, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The partition's edge program, run as a float32 twin (see _Float32Twin), on its tensor arguments."""
    sig = program.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    constants = {**program.state_dict, **program.constants}
    constant_nodes = set()
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in named:
            constant_nodes.add(node)
        elif node.op == "call_function" and node.all_input_nodes and set(node.all_input_nodes) <= constant_nodes:
            constant_nodes.add(node)
    user = dict(zip(_tensor_user_inputs(program), inputs))
    args = [constants[named[spec.arg.name]] if spec.arg.name in named else user.get(spec.arg.name)
            for spec in sig.input_specs]
    # Integer inputs (sizes ExecuTorch passes to several delegates): the size of a tensor input.
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for i, spec in enumerate(sig.input_specs):
        size = placeholders[spec.arg.name].meta["val"]
        if isinstance(size, torch.SymInt):
            args[i] = next(user[name].shape[axis] for name in user
                           for axis, dim in enumerate(placeholders[name].meta["val"].shape)
                           if isinstance(dim, torch.SymInt) and dim.node.expr == size.node.expr)
    with torch.no_grad():
        outputs = _Float32Twin(program.graph_module, constant_nodes).run(*args)
    return [out.float() for out in outputs]


def _shape(spec: blob.TensorSpec, tokens: int) -> list[int]:
    return [d.size if d.size is not None else int(sympy.sympify(d.name).subs("tokens", tokens)) for d in spec.dims]


def assert_onnx_matches_partition(program, contents: blob.BlobContents, tokens: int) -> None:
    assert [spec.name for spec in contents.inputs] == _tensor_user_inputs(program)
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


class _SizeArgument(torch.nn.Module):
    """Takes a size as an integer argument, as a delegate does when ExecuTorch shares it."""

    def forward(self, w, n: int, x):
        torch._check(n == x.shape[0])
        return x.view(n, 2, -1).sum(1) * w + n


def test_integer_input_is_recomputed_from_a_tensor_input():
    shapes = (None, torch.export.Dim.DYNAMIC, {0: torch.export.Dim.DYNAMIC})
    ep = torch.export.export(_SizeArgument(), (torch.randn(3), 5, torch.randn(5, 6)), dynamic_shapes=shapes)
    lowered = lower_to_onnx(ep, CompileOptions(shape_ranges={"x:0": ShapeRange(1, 8, 64)}))
    assert [spec.name for spec in lowered.inputs] == ["w", "x"]  # tensor arguments only, in order
    assert [i.name for i in lowered.onnx.graph.input] == ["w", "x"]
    session = reference.evaluator(lowered.onnx)
    for tokens in (1, 7, 64):
        w, x = torch.randn(3), torch.randn(tokens, 6)
        (got,) = session.run(None, {"w": w.numpy(), "x": x.numpy()})
        np.testing.assert_allclose(got, _SizeArgument()(w, tokens, x).numpy(), rtol=1e-5, atol=1e-5)


def test_integer_input_no_tensor_carries_is_refused():
    class Scale(torch.nn.Module):
        def forward(self, x, n: int):
            return x * n

    shapes = ({0: torch.export.Dim("tokens", max=64)}, torch.export.Dim.DYNAMIC)
    ep = torch.export.export(Scale(), (torch.randn(3, 4), 5), dynamic_shapes=shapes)
    with pytest.raises(LoweringError, match=r"input 'n' is an integer .* no tensor input .* \['x'\]"):
        lower_to_onnx(ep, CompileOptions())
