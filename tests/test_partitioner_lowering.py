"""End to end through ExecuTorch's public API: each part's partition reaches preprocess with its own compile specs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules

from et_trt_backend import BACKEND_ID
from et_trt_backend.options import OPTIONS_SPEC_KEY, PART_SPEC_KEY
from et_trt_backend.serialization.blob import deserialize
from et_trt_partitioner import TensorRTPartitioner

pytestmark = pytest.mark.slow  # lowers the example policy: ONNX + kernels, ~40 s on 2 cores

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import moe_policy  # noqa: E402


@pytest.fixture(scope="module")
def lowered():
    exported = moe_policy.export_policy()
    return to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(ROOT / "examples" / "recipe.toml")])


def test_two_parts_receive_different_compile_specs(lowered):
    graph_module = lowered.exported_program().graph_module
    delegates = {}
    for _, module, _ in get_lowered_submodules(graph_module):
        assert module.backend_id == BACKEND_ID
        specs = {spec.key: bytes(spec.value) for spec in module.compile_specs}
        delegates[specs[PART_SPEC_KEY].decode()] = (json.loads(specs[OPTIONS_SPEC_KEY]), module)
    assert set(delegates) == {"decoder", "velocity"}
    decoder, velocity = delegates["decoder"][0], delegates["velocity"][0]
    assert (decoder["precision"], velocity["precision"]) == ("bf16", "fp16")
    assert (decoder["optimization_level"], velocity["optimization_level"]) == (3, 5)
    assert (decoder["workspace_bytes"], velocity["workspace_bytes"]) == (2 << 30, 1 << 30)
    assert decoder["shape_ranges"]["tokens"] == {"min": 2, "opt": 64, "max": 512}
    # The blob preprocess wrote carries the same part and options.
    for part, (options, module) in delegates.items():
        blob = deserialize(module.processed_bytes)
        assert blob.part == part
        assert blob.options.precision == options["precision"]


def test_nothing_but_delegate_calls_is_left(lowered):
    graph = lowered.exported_program().graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    delegate_calls = [n for n in calls if n.target is torch.ops.higher_order.executorch_call_delegate]
    assert len(delegate_calls) == 2
    others = {str(n.target) for n in calls if n not in delegate_calls and "getitem" not in str(n.target)}
    assert not others, f"left to ExecuTorch: {others}"


def test_program_serializes(lowered):
    assert len(lowered.to_executorch().buffer) > 0
