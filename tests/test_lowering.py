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

import onnx_reference
from et_trt_backend.backend import EtTrtBackend  # noqa: F401  (registers the backend by name)
from et_trt_backend.lowering import LoweringError, lower_to_onnx
from et_trt_backend.options import CompileOptions, ShapeRange
from et_trt_backend.serialization import blob, external_data
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
    """(edge program, blob contents) of every delegate in a lowered edge manager, its named data attached
    from what preprocess handed ExecuTorch."""
    gm = edge.exported_program().graph_module
    parts = []
    for name, module in gm.named_children():
        if name.startswith("lowered_module"):
            contents = blob.deserialize(module.processed_bytes)
            external_data.attach(contents, external_data.store_lookup(module.named_data_store_output),
                                 "the lowered module's named data")
            parts.append((module.original_module, contents))
    return parts


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


def run_partition_float32(program: torch.export.ExportedProgram, inputs: list[torch.Tensor],
                          twin=_Float32Twin) -> list[torch.Tensor]:
    """The partition's edge program, run as a float32 twin (`twin`, see _Float32Twin), on its tensor arguments."""
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
        outputs = twin(program.graph_module, constant_nodes).run(*args)
    return [out.float() for out in outputs]


def _shape(spec: blob.TensorSpec, sizes: int | dict[str, int]) -> list[int]:
    """The input's shape at `sizes` (dynamic dimension name -> size; an int: the token count)."""
    sizes = sizes if isinstance(sizes, dict) else {"tokens": sizes}
    return [d.size if d.size is not None else int(sympy.sympify(d.name).subs(sizes)) for d in spec.dims]


def run_reference_evaluator(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's reference evaluator, GroupedMM included (onnx_reference.py)."""
    return onnx_reference.evaluator(model).run(None, feeds)


def random_float_input(spec: blob.TensorSpec, shape: list[int]) -> torch.Tensor:
    return torch.randn(shape)


def assert_onnx_matches_partition(program, contents: blob.BlobContents, tokens: int | dict[str, int],
                                  run_onnx=run_reference_evaluator, random_input=random_float_input,
                                  rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """The float32 twin of the partition's ONNX, run by `run_onnx` on fresh `random_input`s, matches
    the partition's edge program run in float32."""
    assert [spec.name for spec in contents.inputs] == _tensor_user_inputs(program)
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    inputs = [random_input(spec, _shape(spec, tokens)) for spec in contents.inputs]
    expected = run_partition_float32(program, inputs)
    got = run_onnx(model, {s.name: t.numpy() for s, t in zip(contents.inputs, inputs)})
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        assert out.shape == tuple(ref.shape)
        np.testing.assert_allclose(out, ref.numpy(), rtol=rtol, atol=atol)


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
    session = onnx_reference.evaluator(lowered.with_weights())
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


class _LayoutChains(torch.nn.Module):
    """Attention-style layout code: key/value heads repeated (unsqueeze, expand, reshape), heads
    moved (transpose / permute, then reshape or view after a contiguous copy), a cast of a permuted
    tensor. In the edge program each reshape of a strided tensor is a dim-order clone + view_copy."""

    def forward(self, x):  # [tokens, 2 heads * 8]
        tokens = x.shape[0]
        heads = x.view(1, tokens, 2, 8).transpose(1, 2)  # [1, 2, tokens, 8], strided
        repeated = heads[:, :, None].expand(1, 2, 2, tokens, 8).reshape(1, 4, tokens, 8)
        scores = repeated @ repeated.transpose(-1, -2)  # [1, 4, tokens, tokens]
        mixed = (scores.softmax(-1) @ repeated).permute(0, 2, 1, 3).contiguous().view(tokens, 32)
        cast = heads.permute(0, 2, 3, 1).to(torch.float32).reshape(tokens, 16)
        return mixed, cast


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_layout_chains_lower_with_their_semantics(dynamic):
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    shapes = ({0: torch.export.Dim("tokens", min=2, max=64)},) if dynamic else None
    edge = to_edge_transform_and_lower(torch.export.export(_LayoutChains(), (x,), dynamic_shapes=shapes),
                                       partitioner=[TensorRTPartitioner()])
    (program, contents), = delegated_parts(edge)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("_clone_dim_order" in t for t in targets) and any("view_copy" in t for t in targets)
    for tokens in (2, 6, 64) if dynamic else (6,):
        assert_onnx_matches_partition(program, contents, tokens)


class _WritesAndMasks(torch.nn.Module):
    """Ops real model code brings besides attention and MoE: a tensor assembled slice by slice
    (new_empty + copy_ with a broadcast: copy and slice_scatter), counts of bool flags (cumsum),
    any over a mask, and a scalar raised to tensor powers (rotary inverse frequencies)."""

    def __init__(self):
        super().__init__()
        self.row = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))

    def forward(self, x):  # [tokens, 4]
        out = x.new_empty(x.shape[0], 6)
        out[:, :4].copy_(self.row)  # broadcast over the tokens
        out[:, 4:] = x[:, :2]
        flags = x > 0
        starts = flags.cumsum(-1)  # int64 counts of a bool tensor
        seen = flags.any(-1, keepdim=True)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 4, 2, dtype=torch.float32) / 4))
        return out * seen + starts.to(x.dtype)[:, :1], x.float()[:, :2] * inv_freq


def test_writes_and_mask_ops_lower_with_their_semantics():
    x = torch.randn(6, 4, dtype=torch.bfloat16)
    exported = torch.export.export(_WritesAndMasks(), (x,), dynamic_shapes=({0: torch.export.Dim("tokens", max=64)},))
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner()])
    (program, contents), = delegated_parts(edge)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    for op in ("aten.copy.default", "aten.slice_scatter.default", "aten.cumsum.default", "aten.any.dim"):
        assert any(op in t for t in targets), f"{op} is not in the partition: the test no longer covers it"
    for tokens in (1, 7, 64):
        assert_onnx_matches_partition(program, contents, tokens)
