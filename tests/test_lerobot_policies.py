"""LeRobot 0.4.4's own policies, exported as a deployer ships them, are each ONE TensorRT engine per program.

Each policy (tests/support/lerobot_policies.py builds them tiny, no hub, policy code unmodified) is exported
once for the module: its programs through torch.export and to_edge_transform_and_lower with one
TensorRTPartitioner recipe and the compile config `et-trt export` passes into one .pte (engines are left to
the check below). Then
- every program is one partition and ExecuTorch runs no op of its own (a leftover op is an engine boundary
  and a device-to-host copy at every control step on the robot);
- `et-trt check --build --require-builder` passes: the pre-flight rules, then NVIDIA's ONNX parser and
  builder (TensorRT for RTX, on this CPU) build every partition, for one target (kernel_archs), the policies
  taking sm_80 and sm_120a in turn (test_real_builder.py builds the example for every target).
WALL-OSS's step, which goes through both masked-row rewrites, is also checked numerically against PyTorch.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time

import numpy as np
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_partitioner import TensorRTPartitioner, cli
from support import lerobot_policies as policies

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.slow

POLICIES = ["act", "diffusion", "groot", "xvla", "smolvla", "pi0", "wall_x"]
BUILD_TARGETS = ["sm_80", "sm_120a"]


def _build_target(name: str) -> str:
    """The one target the policy's partitions are built for: the policies take BUILD_TARGETS in turn."""
    return BUILD_TARGETS[POLICIES.index(name) % len(BUILD_TARGETS)]


def _build(name: str, folder):
    """The policy's programs and recipe, as a context (pi0's build and export need its transformers adapters)."""
    if name in ("pi0", "wall_x"):
        return getattr(policies, name)()
    if name == "smolvla":
        return contextlib.nullcontext(policies.smolvla(folder))
    return contextlib.nullcontext(getattr(policies, name)())


def _outside_delegates(program) -> collections.Counter:
    """Ops ExecuTorch would run itself: every call but the delegate calls and the picking of their outputs."""
    return collections.Counter(
        getattr(node.target, "__name__", str(node.target)) for node in program.graph.nodes
        if node.op == "call_function" and node.target is not torch.ops.higher_order.executorch_call_delegate
        and getattr(node.target, "__name__", "") != "getitem")


def _partitions(program) -> int:
    return sum(1 for name, _ in program.graph_module.named_children() if name.startswith("lowered_module"))


@pytest.fixture(scope="module", params=POLICIES)
def lowered(request, tmp_path_factory):
    """(policy name, {program: (partitions, ops left to ExecuTorch)}, .pte path), exported once per policy."""
    policies.import_lerobot()
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    start = time.process_time()
    with _build(name, folder) as policy, torch.no_grad():
        exported = {program: torch.export.export(p.module, p.args) for program, p in policy.programs.items()}
    recipe = {**policy.recipe, "default": {**policy.recipe.get("default", {}), "engine_build": "never",
                                           "kernel_archs": [_build_target(name)]}}
    # as `et-trt export` lowers them: the preserved ops in the compile config (ExecuTorch traces each program once less)
    partitioner = TensorRTPartitioner(recipe, preserved_ops_in_config=True)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner],
                                       compile_config=TensorRTPartitioner.edge_compile_config())
    found = {program: (_partitions(edge.exported_program(program)), _outside_delegates(edge.exported_program(program)))
             for program in exported}
    pte = folder / f"{name}.pte"
    pte.write_bytes(edge.to_executorch().buffer)  # plans memory in the edge programs: count before
    logger.warning("lerobot %s: exported and lowered in %.0f CPU-seconds: %s", name, time.process_time() - start,
                   {program: (parts, dict(outside)) for program, (parts, outside) in found.items()})
    return name, found, pte


def test_every_program_is_one_tensorrt_partition(lowered):
    name, found, _ = lowered
    problems = {program: f"{partitions} partition(s), ops left to ExecuTorch: {dict(outside)}"
                for program, (partitions, outside) in found.items() if outside or partitions != 1}
    assert not problems, f"{name}: {problems}"


def test_nvidia_builder_builds_every_partition(lowered, capsys):
    name, found, pte = lowered
    assert cli.main(["check", "--build", "--require-builder", str(pte)]) == 0, capsys.readouterr().out
    out, partitions = capsys.readouterr().out, sum(parts for parts, _ in found.values())
    assert f"{partitions} partition(s), 0 violation(s), 0 build failure(s)" in out
    assert out.count(f": built for {_build_target(name)} in ") == partitions, out


def test_wall_x_step_matches_pytorch():
    """WALL-OSS's step goes through both masked-row rewrites (its experts dense, its action rows by rank): its
    ONNX, made float32 (the reference evaluator has no bf16 arithmetic), against the step in float32 on fresh
    prompts and actions, the action tokens where the policy puts them and elsewhere."""
    from et_trt_backend.serialization import external_data
    from et_trt_backend.serialization.pte import read_partitions
    from support import onnx_reference

    policies.import_lerobot()
    recipe = {"default": {"engine_build": "never", "kernel_archs": ["sm_80"]}}
    with policies.wall_x() as policy, torch.no_grad():
        step, args = policy.programs["denoise_step"]
        edge = to_edge_transform_and_lower({"denoise_step": torch.export.export(step, args)},
                                           partitioner=[TensorRTPartitioner(recipe)])
        (partition,) = read_partitions(edge.to_executorch().buffer)
        contents = partition.contents
        twin = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
        evaluator = onnx_reference.evaluator(twin)
        step32 = step.float()
        input_ids = args[0]
        action = int(input_ids[0, -1])  # the prompt ends with the action tokens
        generator = torch.Generator().manual_seed(5)
        for shuffled in (False, True):
            ids = input_ids.clone()
            ids[ids != action] = torch.randint(1, 58, (int((ids != action).sum()),), generator=generator)
            if shuffled:
                ids = ids[:, torch.randperm(ids.shape[1], generator=generator)]
            fresh = (ids, torch.randn(args[1].shape, generator=generator), args[2],
                     args[3], torch.randn(args[4].shape, generator=generator), torch.rand((), generator=generator),
                     args[6])
            by_name = dict(zip(["input_ids", "inputs_embeds", "attention_mask", "position_ids", "noisy_action",
                                "timestep", "dof_mask"], fresh))
            got, *checks = evaluator.run(None, {spec.name: by_name[spec.name].numpy() for spec in contents.inputs})
            assert all(bool(c) for c in checks)
            np.testing.assert_allclose(got, step32(*fresh).numpy(), rtol=1e-4, atol=1e-4)
