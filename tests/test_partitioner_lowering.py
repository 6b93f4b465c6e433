"""End to end through ExecuTorch's public API, the example policy with its recipe, lowered once: each part's
partition reaches preprocess with its own compile specs, and its ONNX matches the PyTorch partition."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx.numpy_helper
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules

from et_trt_backend import BACKEND_ID
from et_trt_backend.options import OPTIONS_SPEC_KEY, PART_SPEC_KEY, ShapeRange
from et_trt_backend.serialization import external_data
from et_trt_backend.serialization.blob import deserialize
from et_trt_partitioner import TensorRTPartitioner
from support.lowering import assert_onnx_matches_partition, delegated_parts

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


def test_example_policy_with_its_recipe(lowered):
    """The decoder's token range as the recipe sets it; each partition's ONNX against the PyTorch partition in
    float32 twins (support/lowering.py) across that range; each weight stored once in the ONNX."""
    parts = delegated_parts(lowered)
    by_part = {contents.part: contents for _, contents in parts}
    assert set(by_part) == {"decoder", "velocity"}
    tokens = by_part["decoder"].inputs[0].dims[0]
    assert (tokens.name, tokens.min, tokens.opt, tokens.max) == ("tokens", 2, 64, 512)
    assert by_part["decoder"].options.shape_ranges["tokens"] == ShapeRange(2, 64, 512)
    for program, contents in parts:
        for count in (2, 7, 100, 512):
            assert_onnx_matches_partition(program, contents, count)
        _assert_weights_stored_once(program, contents)


def _assert_weights_stored_once(program, contents):
    """The ONNX initializers hold each parameter once (plus a few small constants), no copies."""
    graph = external_data.onnx_with_weights(contents.onnx, contents.weights).graph
    stored = sum(onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer)
    params = sum(program.state_dict[name].nbytes for name in program.graph_signature.inputs_to_parameters.values())
    assert params <= stored < 1.02 * params


def test_program_serializes(lowered):
    assert len(lowered.to_executorch().buffer) > 0
