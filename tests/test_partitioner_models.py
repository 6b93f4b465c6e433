"""The models the partitioner tests rely on compute what they claim, and the pre-edge rewrites keep their meaning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from et_trt_partitioner.pre_edge_rewrites import rewrite_for_edge
from support import moe_models

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import moe_policy  # noqa: E402


def reference_experts(x, weights, ids, gate_up, down):
    """Per-token float64 MoE: sum_k w_k * down_e(silu(gate_e x) * up_e x); weights stored [E, out, in]."""
    x, weights = x.double(), weights.double()
    gate_up, down = gate_up.double(), down.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += weights[t, k] * (down[e] @ (F.silu(gate) * up))
    return out


def assert_close_bf16(actual, expected):
    # bf16 has 8 mantissa bits; two GEMMs and a sum of top-k rows: a few bf16 ulps of the output scale.
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected, atol=3e-2 * scale, rtol=3e-2)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(combine="index_add", top_k=1), dict(experts=8, top_k=8, combine="scatter_add", sort="sort"),
     dict(experts=8, groups=(4, 2), scoring="sigmoid", counts="one_hot", sort="sort_stable"),
     dict(counts="bincount"), dict(combine="index_add_int32")],
    ids=["index_put", "top1-index_add", "top8-scatter_add", "group-limited", "bincount", "index_add_int32"],
)
def test_grouped_moe_matches_per_token_reference(kwargs):
    module = moe_models.bf16(moe_models.GroupedMoE(**kwargs), seed=3)
    x = torch.randn(7, 32, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    with torch.no_grad():
        weights, ids = module.route(x)
        actual = module(x)
        expected = reference_experts(x, weights, ids, module.gate_up_proj, module.down_proj)
    assert_close_bf16(actual, expected)


@pytest.mark.parametrize("combine", ["index_add", "index_put"])
def test_policy_experts_match_reference(combine):
    experts = moe_policy.build_policy(seed=5).decoder.layers[0].moe.experts
    experts.combine = combine
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(9, moe_policy.HIDDEN, generator=generator).to(torch.bfloat16)
    ids = torch.randint(0, moe_policy.NUM_EXPERTS, (9, moe_policy.TOP_K), generator=generator)
    weights = torch.rand(9, moe_policy.TOP_K, generator=generator).to(torch.bfloat16)
    with torch.no_grad():
        actual = experts(x, weights, ids)
    assert_close_bf16(actual, reference_experts(x, weights, ids, experts.gate_up, experts.down))


def test_policy_contract():
    policy = moe_policy.build_policy()
    assert not policy.training
    assert all(p.dtype == torch.bfloat16 for p in policy.parameters())
    inputs = moe_policy.example_inputs(num_tokens=5)
    assert [tuple(t.shape) for t in inputs] == [(5, moe_policy.OBS_DIM), (moe_policy.HORIZON, moe_policy.ACTION_DIM), (1,)]
    assert moe_policy.dynamic_shapes()["observations"][0].__name__ == "tokens"
    # Same seed, same weights; another seed, other weights.
    assert torch.equal(policy.velocity.action_out.weight, moe_policy.build_policy().velocity.action_out.weight)
    assert not torch.equal(policy.velocity.action_out.weight, moe_policy.build_policy(1).velocity.action_out.weight)


def test_exported_policy_runs_any_token_count():
    exported = moe_policy.export_policy()
    policy = moe_policy.build_policy()
    for tokens in (3, 40):
        inputs = moe_policy.example_inputs(num_tokens=tokens, seed=tokens)
        with torch.no_grad():
            torch.testing.assert_close(exported.module()(*inputs), policy(*inputs), atol=0, rtol=0)


class _RewriteTargets(torch.nn.Module):
    def forward(self, x, ids):
        values, order = torch.sort(x, stable=True, dim=-1)
        a, b = x.split([3, 5], dim=1)
        chunks = torch.chunk(x, 3, dim=1)
        counts = F.one_hot(ids, 6).sum(0)
        perm = torch.argsort(ids, stable=True)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.shape[0])
        eyes = torch.eye(x.shape[0], dtype=x.dtype), torch.eye(3, 5, dtype=torch.int32)
        return values, order, a, b, *chunks, counts, inverse, *eyes


def test_rewrites_keep_meaning():
    x = torch.randn(4, 8)
    x[:, 4] = x[:, 1]  # ties: stability matters
    ids = torch.tensor([0, 5, 2, 2, 3])
    exported = torch.export.export(
        _RewriteTargets(), (x, ids), dynamic_shapes=({0: torch.export.Dim("n")}, {0: torch.export.Dim("m")})
    )
    rewritten = rewrite_for_edge(exported)
    targets = {str(n.target) for n in rewritten.graph.nodes if n.op == "call_function"}
    assert not targets & {
        "aten.split.Tensor", "aten.split_with_sizes.default", "aten.sort.stable", "aten.one_hot.default",
        "aten.chunk.default", "aten.empty_like.default", "aten.eye.default", "aten.eye.m",
    }
    assert torch.uint8 not in {n.kwargs.get("dtype") for n in rewritten.graph.nodes}  # eye counts in int64
    assert "aten.argsort.stable" in targets
    for rows in (4, 9):
        x = torch.randn(rows, 8)
        x[:, 7] = x[:, 0]
        ids = torch.randint(0, 6, (rows + 1,))
        for want, got in zip(exported.module()(x, ids), rewritten.module()(x, ids)):
            assert torch.equal(want, got)


def test_rewrite_leaves_programs_without_targets_alone():
    exported = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    assert rewrite_for_edge(exported) is exported


def test_bincount_of_expert_ids_becomes_static_counts():
    module = moe_models.bf16(moe_models.GroupedMoE(counts="bincount", combine="index_add"))
    exported = moe_models.export(module)
    rewritten = rewrite_for_edge(exported)
    targets = {str(n.target) for n in rewritten.graph.nodes if n.op == "call_function"}
    assert "aten.bincount.default" not in targets and "aten._assert_scalar.default" not in targets
    assert all(str(s).startswith("s") for s in rewritten.range_constraints)  # no data-dependent size left
    for tokens in (2, 13):
        x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens)).to(torch.bfloat16)
        assert torch.equal(exported.module()(x), rewritten.module()(x))


class _CountAnything(torch.nn.Module):
    def forward(self, x):
        return torch.bincount((x.abs() * 3).long().clamp(max=3).reshape(-1), minlength=4)[:4] * 2


def test_bincount_of_other_values_is_refused_with_its_line():
    from et_trt_partitioner import PartitionError

    exported = torch.export.export(_CountAnything(), (torch.randn(8),))
    with pytest.raises(PartitionError, match=r"bincount.* at \S*test_partitioner_models.py:\d+ \(forward\): .*minlength=num_experts"):
        rewrite_for_edge(exported)
