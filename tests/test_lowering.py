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
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.lowering import LoweringError, lower_to_onnx
from et_trt_backend.options import CompileOptions, ShapeRange
from et_trt_partitioner import TensorRTPartitioner
from support import onnx_reference
from support.lowering import assert_onnx_matches_partition, delegated_parts, lower
from support.moe_models import RoutingMoE

torch.manual_seed(0)


@pytest.mark.parametrize("combine", ["index_add", "inverse_permutation"])
@pytest.mark.parametrize("kernel", [True, False], ids=["groupedmm", "dense"])
def test_dynamic_tokens_match_pytorch(combine, kernel):
    # GroupedMM or dense experts: the fused MoEExperts form is test_moe_fusion.py's.
    options = CompileOptions(grouped_gemm_kernel=kernel, fused_experts=False, kernel_archs=("sm_90a",))
    (program, contents), = lower(RoutingMoE(combine).eval(), 16, True, options)
    names = [n.op_type for n in onnx.ModelProto.FromString(contents.onnx).graph.node]
    assert ("GroupedMM" in names) == kernel
    assert "TopK" in names and names.count("TopK") == 1  # the router's; the sort is a counting sort
    for tokens in (1, 7, 100, 4096):
        assert_onnx_matches_partition(program, contents, tokens)


def test_static_tokens_match_pytorch():
    options = CompileOptions(grouped_gemm_kernel=False)
    (program, contents), = lower(RoutingMoE("index_add").eval(), 7, False, options)
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
