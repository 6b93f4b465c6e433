"""Engines at export with TensorRT for RTX: one per RTX target of kernel_archs, built on this CPU machine by
NVIDIA's real parser and builder through et-trt's C++ engine builder (libet_trt_plugin.so) with the C++ GroupedMM
plugin, embedded in the blob.

Skipped, with the reason, where TensorRT for RTX or the builder library is not installed (pip install
'et-trt[tensorrt-rtx]'; scripts/setup.sh builds the library against ../shared's TensorRT headers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from et_trt_backend.engines import onnx_build, providers
from et_trt_backend.plugin_names import ACTIVATIONS, GROUPED_MM_OP, PLUGIN_NAMESPACE, PLUGIN_VERSION
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import lower_program
from support.nvidia_builders import PluginFields, built_target, serialized_plugin_fields, tensorrt_rtx_or_skip

ROOT = Path(__file__).resolve().parents[1]
RTX_ARCHS = ["sm_80", "sm_86", "sm_89", "sm_120a"]
RTX_PARSER = "libtensorrt_onnxparser_rtx.so.1"


@pytest.fixture(scope="module")
def rtx() -> providers.Builder:
    return tensorrt_rtx_or_skip()


def _lower(recipe_options: dict):
    model = moe_models.bf16(moe_models.GroupedMoE(experts=8, shared=True))
    # GroupedMM nodes, this module's subject (test_moe_fusion.py builds the fused MoEExperts form)
    recipe = {"fused_experts": False, **recipe_options}
    (_, contents), = lower_program(moe_models.export(model), TensorRTPartitioner({"default": recipe}))
    return contents


@pytest.fixture(scope="module")
def exported(rtx):
    """A MoE partition exported with every RTX target and one it cannot build (sm_90a), and a timing cache."""
    handler, log = _Records(), logging.getLogger("et_trt_backend.engine_build")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        contents = _lower({"kernel_archs": ["sm_90a", *RTX_ARCHS], "timing_cache": "/tmp/et_trt_timing.cache"})
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return contents, handler.messages


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.levelname} {record.getMessage()}")


def test_one_engine_per_rtx_target_in_kernel_archs(exported, rtx):
    contents, _ = exported
    assert [(e.provider, e.compute_capability) for e in contents.engines] == \
        [("tensorrt_rtx", 80), ("tensorrt_rtx", 86), ("tensorrt_rtx", 89), ("tensorrt_rtx", 120)]
    for engine in contents.engines:
        assert engine.tensorrt_version == rtx.version and engine.gpu_name == ""  # ahead of time: no GPU
        assert engine.plan.size > 10_000
        assert built_target(engine.plan.bytes()) == engine.compute_capability  # the target the plan records
    assert contents.producer["tensorrt"] == rtx.version


def test_plans_reference_the_kernel_images_instead_of_carrying_them(exported):
    contents, _ = exported
    images_id = hashlib.sha256(b"".join(k.image.bytes() for k in contents.kernels)).digest()
    largest = max(contents.kernels, key=lambda k: k.image.size).image.bytes()
    middle = largest[len(largest) // 2:len(largest) // 2 + 256]
    nodes = [n.op_type for n in onnx.load_from_string(contents.onnx).graph.node].count(GROUPED_MM_OP)
    assert nodes == 2
    for engine in contents.engines:
        plan = engine.plan.bytes()
        assert plan.count(images_id) >= nodes  # each GroupedMM node's 32-byte kernel_images_id field
        assert b"kernel_images_id" in plan and middle not in plan


def test_options_the_build_cannot_apply_are_logged_and_recorded(exported):
    contents, messages = exported
    for engine in contents.engines:
        (note,) = engine.options_not_applied
        assert note == ("timing_cache '/tmp/et_trt_timing.cache': not read by a build ahead of time (TensorRT for "
                        "RTX reads one only with a GPU present)")
    assert any(m.startswith("WARNING") and "do not apply option timing_cache" in m for m in messages)


def test_each_build_is_logged_with_its_target_and_time_and_no_contradiction(exported):
    _, messages = exported
    assert any("cannot target sm_90a; the device builds those engines from the ONNX" in m for m in messages)
    for arch in RTX_ARCHS:
        building = next(i for i, m in enumerate(messages) if m.endswith(f"engine for {arch}"))
        assert re.fullmatch(rf"INFO part 'default': TensorRT for RTX [\d.]+ engine for {arch} built in [\d.]+ s, "
                            rf"[\d.]+ MiB", messages[building + 1])
    assert not any("no engine at export" in m for m in messages)


def test_engine_with_the_plugin_is_no_larger_than_dense_engine_plus_one_copy_of_the_images(exported):
    contents, _ = exported
    dense = _lower({"kernel_archs": RTX_ARCHS, "grouped_gemm_kernel": False})
    assert not dense.kernels and len(dense.engines) == 4
    images = sum(k.image.size for k in contents.kernels)
    for with_plugin, without in zip(contents.engines, dense.engines):
        assert with_plugin.compute_capability == without.compute_capability
        assert with_plugin.plan.size <= 1.2 * (without.plan.size + images)


def test_onnx_nodes_name_the_plugin_the_cpp_creator_registers():
    """The lowering's GroupedMM node names the C++ plugin (name, version, namespace) and its activation codes."""
    header = (ROOT / "runtime" / "src" / "tensorrt" / "grouped_mm_plugin.h").read_text()
    constants = dict(re.findall(r'constexpr char (k\w+)\[\] = "([^"]*)";', header))
    values = {name: int(value) for name, value in re.findall(r"constexpr int32_t (kActivation\w+) = (\d+);", header)}
    assert (constants["kGroupedMMName"], constants["kGroupedMMVersion"], constants["kGroupedMMNamespace"]) == \
        (GROUPED_MM_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    assert values == {"kActivationNone": ACTIVATIONS["none"], "kActivationSwiGLU": ACTIVATIONS["swiglu"]}


def test_each_plugin_in_a_plan_serializes_trans_b_the_kernel_images_id_and_the_activation(exported):
    """Each GroupedMM node of each engine: trans_b 1 (weights [G, N, K]), the 32-byte sha256 naming the blob's
    kernel images, activation 0 (the node had none)."""
    contents, _ = exported
    images_id = hashlib.sha256(b"".join(k.image.bytes() for k in contents.kernels)).digest()
    for engine in contents.engines:
        assert serialized_plugin_fields(engine.plan.bytes()) == [PluginFields(1, images_id, 0)] * 2


def test_a_missing_unversioned_library_is_reported_not_an_abort(rtx, tmp_path):
    """The wheel bug: without libtensorrt_rtx.so beside the parser, parsing a plugin node aborts the process.
    The builder checks first and says how to fix it. Here TensorRT for RTX is a folder without that link."""
    libs = Path(os.environ["ET_TRT_TENSORRT_RTX_DIR"])  # the wheel's, set where the builder was loaded
    broken = tmp_path / "tensorrt_rtx_libs"
    broken.mkdir()
    for library in ("libtensorrt_rtx.so.1", RTX_PARSER):
        (broken / library).symlink_to(libs / library)
    script = textwrap.dedent("""
        from et_trt_backend.engines import providers
        try:
            providers.tensorrt_rtx()
        except providers.BuilderUnavailable as e:
            print("REFUSED:", e)
    """)
    env = {**os.environ, "ET_TRT_TENSORRT_RTX_DIR": str(broken),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"REFUSED: TensorRT for RTX lacks libtensorrt_rtx.so beside {RTX_PARSER}" in done.stdout
    assert f"ln -s libtensorrt_rtx.so.1 {broken}/libtensorrt_rtx.so" in done.stdout


def test_build_failures_are_errors_with_the_builders_message(exported, rtx):
    contents, _ = exported
    model = onnx.load_from_string(contents.onnx)
    for node in model.graph.node:
        if node.op_type == GROUPED_MM_OP:
            node.domain, node.op_type = "et_trt", "GroupedMMv2"  # no such plugin
            break
    broken = dataclasses.replace(contents, onnx=model.SerializeToString())
    with pytest.raises(onnx_build.BuildFailed, match=r"TensorRT for RTX's ONNX parser refused the partition:\n  "
                       r"node '[^']+' \(GroupedMMv2\): .*Plugin not found, are the plugin name, version, and "
                       r"namespace correct\?"):
        onnx_build.parse_and_build(rtx, broken, "sm_86")
