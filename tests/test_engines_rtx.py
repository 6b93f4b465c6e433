"""Engines at export with TensorRT for RTX: one per RTX target of kernel_archs, built on this CPU machine by
NVIDIA's real parser and builder with the Python build phase of the GroupedMM plugin, embedded in the blob.

Skipped, with the reason, where TensorRT for RTX is not installed (pip install 'et-trt[tensorrt-rtx]').
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from et_trt_backend.engines import grouped_mm_plugin, onnx_build, providers
from et_trt_backend.plugin_names import ACTIVATIONS, GROUPED_MM_OP, PLUGIN_NAMESPACE, PLUGIN_VERSION
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.lowering import lower_program
from support.nvidia_builders import serialized_plugin_fields, tensorrt_rtx_or_skip

ROOT = Path(__file__).resolve().parents[1]
RTX_ARCHS = ["sm_80", "sm_86", "sm_89", "sm_120a"]


@pytest.fixture(scope="module")
def rtx() -> providers.Builder:
    return tensorrt_rtx_or_skip()


def _lower(recipe_options: dict):
    model = moe_models.bf16(moe_models.GroupedMoE(experts=8, shared=True))
    # GroupedMM nodes, which the Python plugin builds (MoEExperts has only the C++ one: test_moe_fusion.py)
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
        assert note.startswith("timing_cache '/tmp/et_trt_timing.cache': not read by a build at export")
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


def test_python_plugin_has_the_cpp_plugins_name_version_namespace_and_fields(rtx):
    header = (ROOT / "runtime" / "src" / "tensorrt" / "grouped_mm_plugin.h").read_text()
    constants = dict(re.findall(r'constexpr char (k\w+)\[\] = "([^"]*)";', header))
    values = {name: int(value) for name, value in re.findall(r"constexpr int32_t (kActivation\w+) = (\d+);", header)}
    assert (constants["kGroupedMMName"], constants["kGroupedMMVersion"], constants["kGroupedMMNamespace"]) == \
        (GROUPED_MM_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    _, creator_class = grouped_mm_plugin.plugin_classes(rtx.module)
    creator = creator_class([])
    assert (creator.name, creator.plugin_version, creator.plugin_namespace) == (GROUPED_MM_OP, PLUGIN_VERSION,
                                                                              PLUGIN_NAMESPACE)
    assert [(f.name, f.type) for f in creator.field_names] == [
        (constants["kTransBField"], rtx.module.PluginFieldType.INT32),
        (constants["kActivationField"], rtx.module.PluginFieldType.INT32)]
    assert (grouped_mm_plugin.TRANS_B_FIELD, grouped_mm_plugin.KERNEL_IMAGES_ID_FIELD,
            grouped_mm_plugin.ACTIVATION_FIELD) == \
        (constants["kTransBField"], constants["kKernelImagesIdField"], constants["kActivationField"])
    assert values == {"kActivationNone": ACTIVATIONS["none"], "kActivationSwiGLU": ACTIVATIONS["swiglu"]}


def _field(trt, name, values, kind):
    return trt.PluginField(name, np.asarray(values), kind)


def test_plugin_serializes_trans_b_the_kernel_images_id_and_the_activation(exported, rtx):
    contents, _ = exported
    trt = rtx.module
    _, creator_class = grouped_mm_plugin.plugin_classes(trt)
    creator = creator_class(contents.kernels)
    fields = trt.PluginFieldCollection([_field(trt, "trans_b", np.array([1], np.int32), trt.PluginFieldType.INT32)])
    plugin = creator.create_plugin("gmm", fields, trt.TensorRTPhase.BUILD)
    serialized = {f.name: (f.type, np.asarray(f.data).tobytes()) for f in plugin.get_fields_to_serialize()}
    assert serialized == {
        "trans_b": (trt.PluginFieldType.INT32, np.array([1], np.int32).tobytes()),
        "kernel_images_id": (trt.PluginFieldType.UNKNOWN,
                             hashlib.sha256(b"".join(k.image.bytes() for k in contents.kernels)).digest()),
        "activation": (trt.PluginFieldType.INT32, np.array([0], np.int32).tobytes()),  # none: the node had none
    }
    # What an engine serialized is taken back at run time (the images are this blob's).
    again = creator.create_plugin("gmm", plugin.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME)
    assert again is not None and again.trans_b and again.images_id == plugin.images_id


@pytest.mark.parametrize("fields, refusal", [
    ([("trans_b", np.array([1.5], np.float32), "FLOAT32")], r"field trans_b must be one integer, 0 or 1; got FLOAT32"),
    ([("trans_b", np.array([2], np.int32), "INT32")], r"field trans_b must be one integer, 0 or 1; got INT32 \[2\]"),
    ([], r"field trans_b is missing"),
    ([("trans_b", np.array([1], np.int32), "INT32"), ("kernel_images_id", np.zeros(32, np.uint8), "UNKNOWN")],
     r"kernel_images_id 0000000000000000\.\.\. names other kernel images than this blob's"),
    ([("trans_b", np.array([1], np.int32), "INT32"), ("kernel_images_id", np.zeros(8, np.uint8), "UNKNOWN")],
     r"field kernel_images_id must be 32 bytes \(UNKNOWN\); got UNKNOWN, 8 bytes"),
    ([("trans_b", np.array([0], np.int32), "INT32")], r"no kernel image for trans_b=0"),
], ids=["float-trans_b", "trans_b-2", "no-trans_b", "other-images", "short-id", "no-images-for-layout"])
def test_plugin_refuses_fields_it_cannot_take(exported, rtx, fields, refusal):
    contents, _ = exported
    trt = rtx.module
    _, creator_class = grouped_mm_plugin.plugin_classes(trt)
    creator = creator_class(contents.kernels)
    collection = trt.PluginFieldCollection([
        _field(trt, name, data, getattr(trt.PluginFieldType, kind)) for name, data, kind in fields])
    assert creator.create_plugin("gmm0", collection, trt.TensorRTPhase.BUILD) is None
    (message,) = creator.refusals
    assert re.search(rf"GroupedMM node 'gmm0': .*{refusal}", message), message


def test_a_missing_unversioned_library_is_reported_not_an_abort(rtx, tmp_path):
    """The wheel bug: without libtensorrt_rtx.so beside the parser, parsing a plugin node aborts the process.
    et-trt checks first and says how to fix it. Here the parser library is loaded from a folder without it."""
    libs = Path(sys.modules["tensorrt_rtx_libs"].__file__).parent if "tensorrt_rtx_libs" in sys.modules else None
    if libs is None:
        pytest.skip("TensorRT for RTX was not installed from its wheels (no tensorrt_rtx_libs package)")
    broken = tmp_path / "tensorrt_rtx_libs"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / providers.RTX_PARSER_LIBRARY).write_bytes((libs / providers.RTX_PARSER_LIBRARY).read_bytes())
    (broken / "libtensorrt_rtx.so.1").symlink_to(libs / "libtensorrt_rtx.so.1")
    script = textwrap.dedent(f"""
        import ctypes
        for library in ("libtensorrt_rtx.so.1", {providers.RTX_PARSER_LIBRARY!r}):  # as the wheel's package does
            ctypes.CDLL({str(broken)!r} + "/" + library)
        from et_trt_backend.engines import providers
        try:
            providers.tensorrt_rtx()
        except providers.BuilderUnavailable as e:
            print("REFUSED:", e)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"REFUSED: TensorRT for RTX lacks libtensorrt_rtx.so beside {providers.RTX_PARSER_LIBRARY}" in done.stdout
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


# ---- the real C++ plugin ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpp_plugin() -> Path:
    from et_trt_backend import runtime

    try:
        return runtime.plugin_library_path()
    except runtime.RuntimeLoadError as e:
        pytest.skip(f"the C++ plugin library is not built here: {e}")


def test_python_plugin_serializes_in_a_plan_what_the_cpp_plugin_serializes(exported, rtx, cpp_plugin):
    """Same partition, same target, the plugin's build phase in Python or the real C++ plugin loaded as a
    plugin library: each GroupedMM node's fields (trans_b, kernel_images_id) are the same bytes in both plans.
    (The plans as a whole differ from one build to the next, whichever plugin serves them.)"""
    contents, _ = exported
    for target in ("sm_80", "sm_120a"):
        with_python = serialized_plugin_fields(onnx_build.parse_and_build(rtx, contents, target).plan)
        with_cpp = onnx_build.parse_and_build(rtx, contents, target, plugin_library=cpp_plugin)
        assert len(with_python) >= 2  # two GroupedMM nodes
        assert serialized_plugin_fields(with_cpp.plan) == with_python


def test_cpp_plugin_takes_back_the_fields_the_python_plugin_serializes(exported, rtx, cpp_plugin):
    """At run time the C++ creator gets the serialized fields: it accepts the Python plugin's, and refuses a
    kernel_images_id naming images no loaded blob holds."""
    from et_trt_backend import runtime

    contents, _ = exported
    trt = rtx.module
    registry = trt.get_plugin_registry()
    handle = registry.load_library(str(cpp_plugin))
    try:
        runtime.use_kernel_images(ctypes.CDLL(str(cpp_plugin)), contents)
        cpp = registry.get_creator(GROUPED_MM_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE)
        _, creator_class = grouped_mm_plugin.plugin_classes(trt)
        fields = trt.PluginFieldCollection([_field(trt, "trans_b", np.array([1], np.int32), trt.PluginFieldType.INT32)])
        serialized = creator_class(contents.kernels).create_plugin("gmm", fields, trt.TensorRTPhase.BUILD) \
            .get_fields_to_serialize()
        assert cpp.create_plugin("gmm", serialized, trt.TensorRTPhase.RUNTIME) is not None
        unknown = grouped_mm_plugin.serialized_fields(trt, True, bytes(32))
        assert cpp.create_plugin("gmm", unknown, trt.TensorRTPhase.RUNTIME) is None
    finally:
        registry.deregister_library(handle)


def test_fp8_workspace_is_the_launchers_at_the_profiles_max_rows(rtx):
    """The Python plugin asks what the C++ one asks (runtime/tests/grouped_mm_plugin_test.cc checks the same
    numbers): GroupedMMLauncher::fp8_workspace_bytes at the profile's max rows, plus 255 bytes to align it;
    nothing for the dense form. An engine built at export records this size for the robot's C++ plugin."""
    from support.kernel_records import fp8_image_records

    assert grouped_mm_plugin.fp8_workspace_bytes(1000, 64) == 64000 + 4000  # 64000 is 256-aligned
    assert grouped_mm_plugin.fp8_workspace_bytes(3, 5) == 256 + 12
    trt = rtx.module
    _, creator_class = grouped_mm_plugin.plugin_classes(trt)
    fields = trt.PluginFieldCollection([_field(trt, "trans_b", np.array([1], np.int32), trt.PluginFieldType.INT32)])
    plugin = creator_class(fp8_image_records()).create_plugin("gmm", fields, trt.TensorRTPhase.BUILD)
    inputs = [trt.DynamicPluginTensorDesc() for _ in range(4)]
    inputs[0].min, inputs[0].opt, inputs[0].max = trt.Dims([1, 64]), trt.Dims([16, 64]), trt.Dims([1000, 64])
    inputs[1].min = inputs[1].opt = inputs[1].max = trt.Dims([4, 48, 64])  # b [G, N, K]
    outputs = [trt.DynamicPluginTensorDesc()]
    assert plugin.get_workspace_size(inputs, outputs) == grouped_mm_plugin.fp8_workspace_bytes(1000, 64) + 255
    assert plugin.get_workspace_size(inputs[:3], outputs) == 0
    # A gate+up output as a ([rows, 2K]): the rows quantized are the GEMM's, of b's K.
    fields = trt.PluginFieldCollection([_field(trt, "trans_b", np.array([1], np.int32), trt.PluginFieldType.INT32),
                                        _field(trt, "activation", np.array([1], np.int32), trt.PluginFieldType.INT32)])
    fused = creator_class(fp8_image_records()).create_plugin("gmm", fields, trt.TensorRTPhase.BUILD)
    inputs[0].max = trt.Dims([1000, 128])
    assert fused.get_workspace_size(inputs, outputs) == grouped_mm_plugin.fp8_workspace_bytes(1000, 64) + 255
