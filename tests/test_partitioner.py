"""TensorRTPartitioner on the example policy and on MoE blocks written the way public MoE code writes them."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from et_trt_backend import BACKEND_ID, op_support
from et_trt_backend.options import CompileOptions, OptionsError, ShapeRange
from et_trt_partitioner import PartitionError, TensorRTPartitioner
from et_trt_partitioner.moe import find_moe_blocks
from support import moe_models
from support.lowering import delegated_parts
from support.partitioning import Partitioned, edge_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import moe_policy  # noqa: E402

aten = torch.ops.aten

# ---- the example policy ---------------------------------------------------------
@pytest.fixture(scope="module")
def policy_program():
    return moe_policy.export_policy()


@pytest.fixture(scope="module")
def policy_edge(policy_program):
    return edge_of(policy_program)


@pytest.fixture(scope="module")
def policy(policy_edge):
    return Partitioned(policy_edge, ROOT / "examples" / "recipe.toml")


def test_policy_has_one_partition_per_part(policy):
    assert len(policy.result.partition_tags) == 2
    by_part = {policy.options(tag)[1]: tag for tag in policy.result.partition_tags}
    assert set(by_part) == {"decoder", "velocity"}
    decoder, _ = policy.options(by_part["decoder"])
    velocity, _ = policy.options(by_part["velocity"])
    assert (decoder.precision, decoder.optimization_level) == ("bf16", 3)
    assert (velocity.precision, velocity.optimization_level) == ("fp16", 5)
    assert decoder.kernel_archs == ("sm_87", "sm_90a", "sm_110a")
    # Each part's partition holds that part's MoE blocks: 2 in the decoder, 1 in the head.
    assert policy.ops_in(by_part["decoder"])[aten._grouped_mm.default] == 4
    assert policy.ops_in(by_part["velocity"])[aten._grouped_mm.default] == 2
    for tag in by_part.values():
        assert policy.result.partition_tags[tag].backend_id == BACKEND_ID == "EtTrtBackend"


def test_policy_moe_blocks_whole_and_nothing_left_outside(policy):
    policy.assert_moe_blocks_whole(expected_blocks=3)
    assert not policy.outside(), f"ops left to ExecuTorch: {policy.outside()}"
    policy.assert_weights_tagged()
    policy.assert_sizes_stay_local()


def test_policy_shape_ranges(policy):
    ranges = {policy.options(tag)[1]: policy.options(tag)[0].shape_ranges for tag in policy.result.partition_tags}
    # Both parts read the token count; the recipe's [default] gives its range.
    assert ranges["decoder"]["tokens"].to_json() == {"min": 2, "opt": 64, "max": 512}
    assert ranges["velocity"]["tokens"].to_json() == {"min": 2, "opt": 64, "max": 512}


def test_dynamic_token_count_survives_edge_lowering(policy):
    # ExecuTorch's edge validator would specialise it through a split (see partitioner/pre_edge_rewrites.py).
    observations = next(n for n in policy.program.graph.nodes if n.name == "observations")
    assert isinstance(observations.meta["val"].shape[0], torch.SymInt)
    assert [(int(r.lower), int(r.upper)) for r in policy.program.range_constraints.values()] == [(2, 512)]


def test_policy_without_recipe_is_one_partition(policy_edge):
    single = Partitioned(policy_edge)
    assert len(single.result.partition_tags) == 1
    options, part = single.options(next(iter(single.result.partition_tags)))
    assert part == "default"
    assert options == CompileOptions(shape_ranges={"tokens": ShapeRange(2, 512, 512)})
    single.assert_moe_blocks_whole(expected_blocks=3)


def test_ops_to_not_decompose_preserves_with_a_check_function(policy_program):
    ops, check = TensorRTPartitioner().ops_to_not_decompose(policy_program)
    assert aten._grouped_mm.default in ops and set(ops) == set(op_support.PRESERVED_OPS)
    assert callable(check)


def test_a_program_without_preserved_ops_gives_no_check_function_and_is_traced_once_less(monkeypatch):
    """With a check function ExecuTorch traces the whole program three times (its EDGE_DO_NOT_DECOMP path), without
    one once or twice: a program that holds no preserved op gets none, and is delegated all the same."""
    from executorch.exir import to_edge_transform_and_lower

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    program = torch.export.export(model, (torch.randn(2, 8),))
    ops, check = TensorRTPartitioner().ops_to_not_decompose(program)
    assert check is None and set(ops) == set(op_support.PRESERVED_OPS)

    traces = []
    run_decompositions = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *args, **kwargs: traces.append(1) or run_decompositions(self, *args, **kwargs))
    edge = to_edge_transform_and_lower(program, partitioner=[TensorRTPartitioner({"default": {"engine_build": "never"}})])
    # ExecuTorch's functionalization and decomposition to core ATen (a third trace with a check function), then the
    # ONNX exporter's of the one partition
    assert len(traces) == 3
    calls = [n.target for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    assert calls and all(target is torch.ops.higher_order.executorch_call_delegate
                         or getattr(target, "__name__", "") == "getitem" for target in calls), calls


def test_with_export_s_compile_config_a_moe_program_is_traced_once_less_and_lowered_alike(monkeypatch):
    """export()'s way (preserved_ops_in_config and edge_compile_config()): the MoE's _grouped_mm kept without a check
    function, one trace of the program fewer, and the same partitions as the default way."""
    from executorch.exir import to_edge_transform_and_lower

    traces = []
    run_decompositions = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *args, **kwargs: traces.append(1) or run_decompositions(self, *args, **kwargs))
    recipe = {"default": {"grouped_gemm_kernel": False, "engine_build": "never"}}

    def lowered(**config):
        program = moe_models.export(moe_models.bf16(moe_models.GroupedMoE()))
        traces.clear()
        partitioner = TensorRTPartitioner(recipe, preserved_ops_in_config=bool(config))
        assert (partitioner.ops_to_not_decompose(program)[1] is None) == bool(config)
        parts = delegated_parts(to_edge_transform_and_lower(program, partitioner=[partitioner], **config))
        return [(c.onnx, c.inputs, c.outputs) for _, c in parts], len(traces)

    default, default_traces = lowered()
    configured, configured_traces = lowered(compile_config=TensorRTPartitioner.edge_compile_config())
    assert configured_traces == default_traces - 1
    assert len(configured) == 1 and configured == default


# ---- MoE variants written like public libraries -----------------------------------
VARIANTS = {
    "softmax-top2-index_put": dict(),
    "sigmoid-top1-max-router": dict(top_k=1, scoring="sigmoid"),
    "softmax-top8-index_add": dict(experts=8, top_k=8, combine="index_add"),
    "int32-token-index_add": dict(combine="index_add_int32"),
    "group-limited-sigmoid-shared": dict(experts=8, groups=(4, 2), scoring="sigmoid", shared=True),
    "one_hot-counts-sort-scatter_add": dict(counts="one_hot", sort="sort", combine="scatter_add"),
    "sort-stable": dict(sort="sort_stable", shared=True),
    "bincount-counts": dict(counts="bincount", combine="index_add"),
}


CASES = [(name, True) for name in VARIANTS] + [
    ("softmax-top2-index_put", False),
    ("group-limited-sigmoid-shared", False),
]


@pytest.mark.parametrize("name, dynamic", CASES, ids=[f"{n}-{'dynamic' if d else 'static'}" for n, d in CASES])
def test_moe_variant_is_one_partition(name, dynamic):
    module = moe_models.bf16(moe_models.GroupedMoE(**VARIANTS[name]))
    part = Partitioned(edge_of(moe_models.export(module, dynamic=dynamic)))
    assert len(part.result.partition_tags) == 1
    part.assert_moe_blocks_whole(expected_blocks=1)
    assert not part.outside()
    part.assert_weights_tagged()
    part.assert_sizes_stay_local()
    options, _ = part.options(next(iter(part.result.partition_tags)))
    assert ("tokens" in options.shape_ranges) == dynamic


@pytest.fixture(scope="module")
def stack_edge():
    return edge_of(moe_models.export(moe_models.bf16(moe_models.MoEStack())))


def test_unsupported_op_between_blocks_splits_partitions(stack_edge):
    part = Partitioned(stack_edge)
    assert len(part.result.partition_tags) == 2
    assert part.outside() == Counter({aten.masked_scatter.default: 1})
    part.assert_moe_blocks_whole(expected_blocks=2)
    blocks = find_moe_blocks(part.program.graph)
    assert {b.module for b in blocks} == {"moe0", "moe1"}
    assert len({part.tag(b.grouped_mms[0]) for b in blocks}) == 2
    # Both MoE blocks reshape with the token count: ExecuTorch computes it once and passes it to each.
    part.assert_sizes_stay_local()


def test_recipe_parts_get_their_own_partitions_and_options(stack_edge):
    recipe = {"parts": {"moe0": {"precision": "fp16"}, "moe1": {"precision": "fp32", "tf32": False}}}
    part = Partitioned(stack_edge, recipe)
    options = {part.options(t)[1]: part.options(t)[0] for t in part.result.partition_tags}
    # norm (default part), moe0, moe1: partitions never mix parts.
    assert set(options) == {"default", "moe0", "moe1"}
    assert (options["moe0"].precision, options["moe1"].precision, options["moe1"].tf32) == ("fp16", "fp32", False)
    part.assert_moe_blocks_whole(expected_blocks=2)


# float64 ops stay off TensorRT where a recipe turns truncate_double off: the unsupported ops of these tests.
NO_FLOAT64 = {"default": {"truncate_double": False}}


def test_unsupported_op_inside_moe_block_is_named_with_its_source_line():
    module = moe_models.bf16(moe_models.MoEWithUnsupportedOp())
    with pytest.raises(PartitionError) as error:
        Partitioned(edge_of(moe_models.export(module)), NO_FLOAT64)
    message = str(error.value)
    assert "MoE block" in message and "float64" in message
    assert "aten._to_copy" in message or "dim_order" in message
    assert re.search(r"moe_models.py:\d+ \(forward\): ", message), message
    assert "Rewrite that line" in message


def test_recipe_that_splits_a_moe_block_is_refused(stack_edge):
    recipe = {"parts": {"moe0.gate": {"precision": "fp16"}}}
    with pytest.raises(PartitionError, match="splits MoE block 'moe0'"):
        Partitioned(stack_edge, recipe)


class HistcOutsideTensorRT(torch.nn.Module):
    def forward(self, x):
        ids = (x.float().abs() * 3).floor().clamp(0, 3)
        return torch.histc(ids.double(), bins=4, min=0, max=3)  # float64: not lowerable under NO_FLOAT64


def test_op_without_executorch_kernel_is_never_left_outside():
    exported = torch.export.export(HistcOutsideTensorRT(), (torch.randn(8),))
    with pytest.raises(PartitionError, match=r"aten.histc.default at .*ExecuTorch has no kernel"):
        Partitioned(edge_of(exported), NO_FLOAT64)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_model_without_moe_is_one_partition():
    exported = torch.export.export(_Mlp(), (torch.randn(4, 8),), dynamic_shapes=({0: torch.export.Dim("n", max=64)},))
    part = Partitioned(edge_of(exported))
    assert len(part.result.partition_tags) == 1 and not part.outside()
    part.assert_weights_tagged()


def test_nothing_supported_means_no_partition():
    class Unsupported(torch.nn.Module):
        def forward(self, x, mask):
            return x.masked_scatter(mask, x)  # no TensorRT lowering

    part = Partitioned(edge_of(torch.export.export(Unsupported(), (torch.randn(4), torch.rand(4) > 0.5))))
    assert part.result.partition_tags == {}
    assert part.outside() == Counter({aten.masked_scatter.default: 1})


def test_errors_leave_the_program_untagged():
    exported = torch.export.export(_Mlp(), (torch.randn(4, 8),), dynamic_shapes=({0: torch.export.Dim("n")},))
    edge = edge_of(exported)
    with pytest.raises(OptionsError, match="'n' has no upper bound"):
        TensorRTPartitioner().partition(edge)  # unbounded dim and no range in the recipe
    assert not any("delegation_tag" in n.meta for n in edge.graph.nodes)
    bounded = Partitioned(edge, {"default": {"shape_ranges": {"n": {"min": 2, "opt": 16, "max": 128}}}})
    (tag,) = bounded.result.partition_tags
    assert bounded.options(tag)[0].shape_ranges == {"n": ShapeRange(2, 16, 128)}


def test_moe_block_split_by_a_detour_names_the_op():
    module = moe_models.bf16(moe_models.MoEWithDetour())
    with pytest.raises(PartitionError) as error:
        Partitioned(edge_of(moe_models.export(module)))
    message = str(error.value)
    assert "MoE block 'moe' would be split" in message
    assert re.search(r"through aten.masked_scatter.default at \S*moe_models.py:\d+ \(forward\): ", message), message
    assert "has no TensorRT lowering" in message
