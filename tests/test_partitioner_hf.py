"""Unmodified transformers MoE blocks (tiny random configs, grouped_mm experts) partition into one delegate."""

from __future__ import annotations

import pytest
import torch

from support import moe_models
from support.partitioning import Partitioned, edge_of

pytest.importorskip("transformers", reason="the transformers MoE tests need transformers (the [test] extra)")

aten = torch.ops.aten

# (block, top_k): Mixtral softmax top-2; Qwen2-MoE with a sigmoid-gated shared expert; Qwen3-MoE top-8;
# OLMoE top-1; DeepSeek-V3 sigmoid group-limited routing with shared experts; GPT-OSS transposed biased experts.
BLOCKS = [("mixtral", 2), ("qwen2_moe", 2), ("qwen3_moe", 8), ("olmoe", 1), ("deepseek_v3", 2), ("gpt_oss", 2)]
CASES = [(name, k, True) for name, k in BLOCKS] + [("mixtral", 2, False), ("deepseek_v3", 2, False)]


@pytest.mark.parametrize(
    "name, top_k, dynamic", CASES, ids=[f"{n}-top{k}-{'dynamic' if d else 'static'}" for n, k, d in CASES]
)
def test_transformers_moe_block_is_one_delegate(name, top_k, dynamic):
    block = moe_models.hf_moe_block(name, top_k=top_k)
    exported = moe_models.export(block, hidden=moe_models.HF_HIDDEN, dynamic=dynamic, batch=True)
    # The grouped_mm experts path is what we claim to handle: make sure it is the one exported.
    assert sum(n.target is aten._grouped_mm.default for n in exported.graph.nodes) == 2

    part = Partitioned(edge_of(exported))
    assert len(part.result.partition_tags) == 1
    part.assert_moe_blocks_whole(expected_blocks=1)
    assert not part.outside(), f"ops left to ExecuTorch: {part.outside()}"
    tag = next(iter(part.result.partition_tags))
    ops = part.ops_in(tag)
    for op in (aten.topk.default, aten.sort.default, aten.histc.default, aten.cumsum.default, aten.index_put.default):
        assert ops[op] >= 1, f"{op} missing from the delegate"
    assert ops[aten.topk.default] == (3 if name == "deepseek_v3" else 1)  # group scores, groups, experts
    part.assert_weights_tagged()
    part.assert_sizes_stay_local()
    options, _ = part.options(tag)
    assert ("tokens" in options.shape_ranges) == dynamic
