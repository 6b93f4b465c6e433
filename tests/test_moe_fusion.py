"""Each MoE block of every family the partitioner claims lowers to one et_trt::MoEExperts node (issue 32):
the ONNX node count per block, the partition's ONNX (its MoEExperts run by the float64 reference of
support/onnx_reference.py) against the PyTorch partition in float32, the recorded form of each block, the
fallback to GroupedMM (fused_experts = false, and a block the pattern does not cover), and NVIDIA's real
builder (TensorRT for RTX, with libet_trt_plugin.so) building the fused partitions for its four targets.

One export per family, shared by the module's checks.
"""

from __future__ import annotations

import collections
import pathlib
import re

import onnx
import pytest
import torch
from torch import nn

from et_trt_backend.engines import onnx_build
from et_trt_backend.engines.providers import RTX_TARGETS
from et_trt_backend.lowering.moe_fusion import FUSED, UNFUSED
from et_trt_backend.onnx_analysis import moe_blocks
from et_trt_backend import plugin_names
from et_trt_backend.plugin_names import GROUPED_MM_OP, MOE_ACTIVATIONS, MOE_EXPERTS_OP
from et_trt_backend.serialization import blob
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import assert_onnx_matches_partition, lower_program
from support.nvidia_builders import serialized_kernel_images_ids, serialized_plugin_fields, tensorrt_rtx_or_skip

RECIPE = {"engine_build": "never", "kernel_archs": ["sm_80"]}
# The dispatch and combine glue the fused node replaces (counting sort, permutation, un-permutation): none of it
# may remain beside a MoEExperts node. (Routers may scatter: group-limited routing builds its mask so.)
DISPATCH_OPS = {"CumSum", "ScatterND", "GatherND", GROUPED_MM_OP}
# An MoE block's nodes besides MoEExperts: its router (gate GEMM, softmax or sigmoid, top-k, normalisation)
# and the reshapes and casts around it; group-limited routing (DeepSeek), the sparse mixer (PhiMoE) and shared
# experts add up to about 30 more. Unfused, a block is about 100 nodes (the example decoder: 216 for two).
MAX_NODES_PER_BLOCK = {"grouped-shared-groups": 40, "deepseek_v3": 45, "phimoe": 40, "qwen2_moe": 28}
MAX_NODES = 16

GROUPED = {
    "grouped-index_put": dict(),
    "grouped-index_add": dict(combine="index_add"),
    "grouped-index_add_int32": dict(combine="index_add_int32", sort="argsort_stable"),
    "grouped-scatter_add-one_hot": dict(sort="sort", combine="scatter_add", counts="one_hot"),
    "grouped-bincount-sort_stable": dict(sort="sort_stable", counts="bincount"),
    "grouped-top1": dict(top_k=1),
    "grouped-shared-groups": dict(experts=8, scoring="sigmoid", groups=(4, 2), shared=True),
}
FAMILIES = [*GROUPED, *moe_models.HF_FAMILIES]
# The activation each family's experts compute (transformers' configs: SiLU, GPT-OSS's clamped GLU).
ACTIVATION = {"gpt_oss": "gptoss_glu"}


def _module(family: str) -> tuple[nn.Module, bool]:
    if family in GROUPED:
        return moe_models.bf16(moe_models.GroupedMoE(**GROUPED[family])), False
    return moe_models.hf_moe_block(family), True


def _lower(module: nn.Module, batch: bool, **options):
    parts = lower_program(moe_models.export(module, batch=batch),
                          TensorRTPartitioner({"default": {**RECIPE, **options}}))
    (program, contents), = parts
    return program, contents


@pytest.fixture(scope="module")
def lowered():
    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = _lower(*_module(family))
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_each_block_is_one_moe_experts_node(lowered, family):
    program, contents = lowered(family)
    model = onnx.load_from_string(contents.onnx)
    ops = collections.Counter(node.op_type for node in model.graph.node)
    assert ops[MOE_EXPERTS_OP] == 1, ops
    assert not DISPATCH_OPS & set(ops), ops
    assert sum(ops.values()) <= MAX_NODES_PER_BLOCK.get(family, MAX_NODES), ops
    (block,) = moe_blocks(model)
    assert block["form"] == FUSED and block["dtype"] == "bf16", block
    (node,) = [n for n in model.graph.node if n.op_type == MOE_EXPERTS_OP]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["activation"] == MOE_ACTIVATIONS[ACTIVATION.get(family, "swiglu")]
    assert attributes["gate_up_layout"] == b"blocked8"  # F = 32: the kernels' fastest layout
    assert {"alpha", "limit", "plugin_version", "plugin_namespace"} <= set(attributes)
    assert (len(node.input) == 7) == (family == "gpt_oss")  # GPT-OSS's biases; no one else has any
    assert {k.kernel for k in contents.kernels} >= {"moe_route", "moe_gate_up_gated", "moe_down", "moe_combine"}


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_partition_matches_pytorch(lowered, family):
    program, contents = lowered(family)
    for tokens in (1, 7, 33):
        assert_onnx_matches_partition(program, contents, tokens)


def test_fused_blob_round_trips(lowered):
    _, contents = lowered("gpt_oss")
    data = blob.serialize(contents)
    back = blob.deserialize(data)
    assert back.kernels == contents.kernels and back.onnx == contents.onnx and back.options.fused_experts
    assert blob.serialize(back) == data


def test_fused_experts_false_keeps_grouped_mm():
    _, contents = _lower(*_module("grouped-index_add"), fused_experts=False)
    model = onnx.load_from_string(contents.onnx)
    ops = collections.Counter(node.op_type for node in model.graph.node)
    assert ops[GROUPED_MM_OP] == 2 and not ops[MOE_EXPERTS_OP], ops
    assert moe_blocks(model) == [{"block": "", "form": UNFUSED, "detail": "fused_experts = false", "dtype": ""}]
    assert not [k for k in contents.kernels if k.kernel.startswith("moe_")]


class _TanhExperts(moe_models.GroupedMoE):
    """Experts whose activation (tanh(gate) * up) is none of MoEExperts': the block stays two GroupedMMs."""

    def forward(self, hidden_states):
        x = hidden_states
        weights, ids = self.route(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        offsets = torch.cumsum(torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1), 0,
                               dtype=torch.int32)
        token = order // self.top_k
        gate, up = torch._grouped_mm(x[token], self.gate_up_proj.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        rows = torch._grouped_mm(torch.tanh(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, token, rows)


class _DeepStack(nn.Module):
    """Six MoE blocks one after another in one partition: each block's router has the earlier blocks' routers
    among its ancestors."""

    def __init__(self, blocks: int = 6):
        super().__init__()
        self.blocks = nn.ModuleList(moe_models.GroupedMoE() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def test_each_fused_block_is_named_by_its_own_module():
    # Regression: the name came from whichever router a set of ancestors yielded first (an earlier block's at
    # random, "blocks" instead of "blocks.3"): `inspect` and the .pte bytes changed from run to run.
    _, contents = _lower(moe_models.bf16(_DeepStack()), False)
    blocks = moe_blocks(onnx.load_from_string(contents.onnx))
    assert [block["block"] for block in blocks] == [f"blocks.{i}" for i in range(6)], blocks
    assert {block["form"] for block in blocks} == {FUSED}


def test_unrecognised_block_keeps_grouped_mm_and_says_why():
    program, contents = _lower(moe_models.bf16(_TanhExperts()), False)
    model = onnx.load_from_string(contents.onnx)
    assert [n.op_type for n in model.graph.node].count(GROUPED_MM_OP) == 2
    (block,) = moe_blocks(model)
    assert block["form"] == UNFUSED and "compute none of the MoEExperts activations" in block["detail"], block
    assert "tanh" in block["detail"]
    assert_onnx_matches_partition(program, contents, 7)


def test_cpp_plugin_has_the_onnx_ops_name_version_namespace_and_fields():
    header = (pathlib.Path(__file__).parents[1] / "runtime/src/tensorrt/moe_experts_plugin.h").read_text()
    constants = dict(re.findall(r'constexpr char (k\w+)\[\] = "([^"]*)";', header))
    assert (constants["kMoEExpertsName"], constants["kMoEExpertsVersion"], constants["kMoEExpertsNamespace"]) == \
        (MOE_EXPERTS_OP, plugin_names.PLUGIN_VERSION, plugin_names.PLUGIN_NAMESPACE)
    assert [constants[f"kMoE{field}Field"] for field in ("Activation", "Layout", "Alpha", "Limit")] == [
        plugin_names.MOE_ACTIVATION_ATTRIBUTE, plugin_names.MOE_LAYOUT_ATTRIBUTE, plugin_names.MOE_ALPHA_ATTRIBUTE,
        plugin_names.MOE_LIMIT_ATTRIBUTE]


# Each kind of block once: hand-written with shared expert, transformers SwiGLU, GPT-OSS biases and clamped GLU.
BUILT_FAMILIES = ["grouped-shared-groups", "mixtral", "gpt_oss"]


@pytest.mark.parametrize("family", BUILT_FAMILIES)
def test_real_builder_builds_the_fused_partition(lowered, family):
    rtx = tensorrt_rtx_or_skip()  # et-trt's C++ builder, with its MoEExperts plugin
    _, contents = lowered(family)
    blocks = len(moe_blocks(onnx.load_from_string(contents.onnx)))
    for target in RTX_TARGETS:
        plan = onnx_build.parse_and_build(rtx, contents, target).plan
        # One plugin per block, each naming the blob's kernel images; no GroupedMM plugin.
        assert len(serialized_kernel_images_ids(plan)) == blocks and not serialized_plugin_fields(plan), target
