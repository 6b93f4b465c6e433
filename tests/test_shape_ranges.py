"""Shape ranges come from what the user exported: a MoE policy exported with Dim("batch", min=1) and
Dim("tokens", min=1) gets TensorRT ranges starting at 1 (ExecuTorch's edge re-trace alone would say 2: its
0/1 specialization), through export, the blob, `et-trt inspect`, the ONNX numerics at batch 1 and one token,
and NVIDIA's own builder with that profile. One export serves the module (the C++ input check of such a blob:
runtime/tests/io_spec_test.cc, ExportedRangesStartAtOne).
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from support import moe_models
from et_trt_backend.options import CompileOptions, ShapeRange
from et_trt_backend.recipe import RecipeError
from et_trt_partitioner import TensorRTPartitioner, cli
from support.lowering import assert_onnx_matches_partition, delegated_parts

BATCH = torch.export.Dim("batch", min=1, max=8)
TOKENS = torch.export.Dim("tokens", min=1, max=64)
# Dense GroupedMM (no kernel images to compile); sm_80 is the target `check --build` builds for.
RECIPE = {"default": {"grouped_gemm_kernel": False, "kernel_archs": ["sm_80"], "engine_build": "never"}}


def _export(batch=BATCH, tokens=TOKENS) -> torch.export.ExportedProgram:
    x = torch.randn(2, 5, 32).to(moe_models.DTYPE)
    with torch.no_grad():
        return torch.export.export(moe_models.bf16(moe_models.GroupedMoE()), (x,),
                                   dynamic_shapes=({0: batch, 1: tokens},))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(edge program, blob contents) of the policy's one partition, and its .pte on disk."""
    edge = to_edge_transform_and_lower(_export(), partitioner=[TensorRTPartitioner(RECIPE)])
    (part,) = delegated_parts(edge)
    path = tmp_path_factory.mktemp("batch1") / "policy.pte"
    path.write_bytes(edge.to_executorch().buffer)
    return part, path


def test_the_blob_keeps_the_exported_ranges(policy):
    (_, contents), _ = policy
    (x,) = contents.inputs
    assert [(d.name, d.min, d.opt, d.max) for d in x.dims[:2]] == [("batch", 1, 8, 8), ("tokens", 1, 64, 64)]
    assert contents.options.shape_ranges == {"batch": ShapeRange(1, 8, 8), "tokens": ShapeRange(1, 64, 64)}


def test_inspect_shows_ranges_from_one(policy, capsys):
    _, path = policy
    assert cli.main(["-q", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hidden_states: bfloat16 [batch 1..8..8, tokens 1..64..64, 32]" in out, out


@pytest.mark.parametrize("batch, tokens", [(1, 1), (1, 7), (3, 1), (8, 64)])
def test_onnx_matches_at_batch_and_token_count_of_one(policy, batch, tokens):
    # Nothing of the traced size (2 x 5) or of the re-trace's "never 1" is baked into the ONNX.
    (program, contents), _ = policy
    assert_onnx_matches_partition(program, contents, {"batch": batch, "tokens": tokens})


def test_the_real_builder_builds_the_profile_from_one(policy, capsys):
    _, path = policy
    assert cli.main(["-q", "check", "--build", "--require-builder", str(path)]) == 0
    out = capsys.readouterr().out
    assert "built for sm_80" in out, out


# ---- the recipe against the exported ranges ------------------------------------------------------
def _resolved_ranges(exported, recipe) -> dict[str, ShapeRange]:
    """The shape ranges the partitioner gives the one partition of `exported` under `recipe`."""
    partitioner = TensorRTPartitioner(recipe)
    result = partitioner.partition(moe_models.edge_program(exported, partitioner))
    (spec,) = result.partition_tags.values()
    return CompileOptions.from_compile_specs(spec.compile_specs)[0].shape_ranges


def test_a_recipe_may_ask_for_min_one_and_narrow():
    recipe = {"default": {"shape_ranges": {"batch": {"min": 1, "opt": 1, "max": 4}}}}
    assert _resolved_ranges(_export(), recipe) == {"batch": ShapeRange(1, 1, 4), "tokens": ShapeRange(1, 64, 64)}


def test_a_recipe_below_the_exported_min_is_refused():
    exported = _export(batch=torch.export.Dim("batch", min=2, max=8))
    with pytest.raises(RecipeError, match=r"range 1\.\.8 lies outside the exported range 2\.\.8 of batch"):
        _resolved_ranges(exported, {"default": {"shape_ranges": {"batch": {"min": 1, "max": 8}}}})


def test_the_users_program_is_left_as_it_was():
    exported = _export()
    before = [dict(n.meta) for n in exported.graph.nodes]
    TensorRTPartitioner().transform_for_pre_decomposition(exported)
    assert [dict(n.meta) for n in exported.graph.nodes] == before
