"""libet_trt_plugin.so, et-trt's engine builder and C++ GroupedMM and MoEExperts plugins, with NVIDIA's TensorRT for RTX (which
runs on this CPU machine): the example's partitions build through it, each plugin in the plan carrying the 32-byte
kernel_images_id (schema.fbs) instead of the images; images that do not match their blob are refused; and the
library is a TensorRT plugin library any TensorRT process loads (getCreators). What the plugin's creator refuses
is tested in runtime/tests/grouped_mm_plugin_test.cc and moe_experts_plugin_test.cc.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from et_trt_backend import runtime
from et_trt_backend.engines import onnx_build
from et_trt_backend.serialization.pte import read_partitions
from support.nvidia_builders import serialized_kernel_images_ids, tensorrt_rtx_or_skip

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rtx():
    return tensorrt_rtx_or_skip()


def _partitions(example_pte):
    return [partition.contents for partition in read_partitions(example_pte.read_bytes(), data_dir=example_pte.parent)]


def test_example_partitions_build_with_one_reference_to_the_images(rtx, example_pte):
    partitions = _partitions(example_pte)
    assert partitions
    for contents in partitions:
        assert contents.kernels, "the example export has no kernel images"
        ident = hashlib.sha256(b"".join(k.image.bytes() for k in contents.kernels)).digest()
        plan = onnx_build.parse_and_build(rtx, contents, "sm_86").plan
        ids = serialized_kernel_images_ids(plan)  # the example's MoE blocks are MoEExperts nodes (fused_experts)
        assert ids and set(ids) == {ident}, f"{contents.part}: {ids}"
        largest = max(contents.kernels, key=lambda k: k.image.size).image.bytes()
        middle = len(largest) // 2
        assert largest[middle:middle + 512] not in plan, f"{contents.part}: the plan still carries kernel images"


def test_kernel_images_that_do_not_match_the_blob_are_not_registered(rtx, example_pte):
    contents = _partitions(example_pte)[0]
    image = contents.kernels[0].image
    damaged = bytearray(image.bytes())
    damaged[len(damaged) // 2] ^= 0x20
    image.data = bytes(damaged)
    with pytest.raises(RuntimeError, match=rf"kernel image 0 \(named data {image.key}, {image.size} bytes\): its "
                                           r"sha256 is [0-9a-f]{16}\.\.\., the blob's"):
        runtime.use_kernel_images(ctypes.CDLL(str(runtime.plugin_library_path())), contents)


def test_the_builder_verifies_the_named_data_against_the_blob(rtx, example_pte):
    """Named data that does not match the blob is refused before anything is parsed, naming the weight."""
    contents = _partitions(example_pte)[0]
    weight = contents.weights[0].data
    weight.data = weight.bytes()[:-1]
    with pytest.raises(onnx_build.BuildFailed, match=rf"weight '[^']+' \(named data {weight.key}, {weight.size} "
                                                     rf"bytes\): the program's data holds {weight.size - 1} bytes"):
        onnx_build.parse_and_build(rtx, contents, "sm_86")


def test_the_library_is_a_tensorrt_plugin_library(rtx):
    """What trtexec or any TensorRT process does with a plugin library: its registry loads it (getCreators,
    setLoggerFinder) and then serves et_trt::GroupedMM v1 and et_trt::MoEExperts v1. In a process of its own: the registry keeps the
    library's creator and logger."""
    script = textwrap.dedent(f"""
        import tensorrt_rtx_bindings as trt
        logger = trt.Logger(trt.Logger.WARNING)
        registry = trt.Builder(logger).get_plugin_registry()
        assert registry.load_library({str(runtime.plugin_library_path())!r}) is not None, "not a plugin library"
        for name in ("GroupedMM", "MoEExperts"):
            creator = registry.get_creator(name, "1", "et_trt")
            print("CREATOR:", creator.name, creator.plugin_version, creator.plugin_namespace)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CREATOR: GroupedMM 1 et_trt" in done.stdout and "CREATOR: MoEExperts 1 et_trt" in done.stdout, done.stdout
