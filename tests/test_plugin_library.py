"""libet_trt_plugin.so, our C++ GroupedMM plugin as a TensorRT plugin library, loaded for real
into NVIDIA's TensorRT for RTX builder (which runs on this CPU machine): the example's
partitions parse and build with it, each plugin in the plan carries the 32-byte
kernel_images_id (schema.fbs) instead of the images, and references that resolve to no
registered blob are refused with a message, not a crash.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading

import numpy as np
import pytest

from et_trt_backend import runtime
from et_trt_backend.engines.onnx_build import parse_partition
from et_trt_backend.serialization.pte import read_partitions

trt = pytest.importorskip(
    "tensorrt_rtx_bindings",
    reason="TensorRT for RTX is not installed (pip install -e '.[tensorrt-rtx]', as scripts/setup.sh does)",
)


@pytest.fixture(scope="module")
def plugin_library() -> str:
    try:
        return str(runtime.plugin_library_path())
    except runtime.RuntimeLoadError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def builder(plugin_library):
    # The parser dlopens the unversioned library name when it adds a plugin layer; without
    # setup's symlink the process aborts (FACTS.md), so say so instead.
    libs = os.path.dirname(trt.__file__).replace("tensorrt_rtx_bindings", "tensorrt_rtx_libs")
    assert os.path.exists(os.path.join(libs, "libtensorrt_rtx.so")), \
        f"{libs}/libtensorrt_rtx.so is missing: run scripts/setup.sh (it links it to libtensorrt_rtx.so.1)"
    logger = trt.Logger(trt.Logger.WARNING)
    b = trt.Builder(logger)
    assert b.get_plugin_registry().load_library(plugin_library) is not None
    return b, logger, ctypes.CDLL(plugin_library)


def _parse(builder, logger, contents):
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parse_partition(parser, contents)
    return network, parser, ok


def _partitions(example_pte):
    return [partition.contents for partition in read_partitions(example_pte.read_bytes(), data_dir=example_pte.parent)]


def test_example_partitions_build_with_one_reference_to_the_images(builder, example_pte):
    b, logger, lib = builder
    partitions = _partitions(example_pte)
    assert partitions
    for contents in partitions:
        assert contents.kernels, "the example export has no kernel images"
        ident = runtime.use_kernel_images(lib, contents)
        assert ident == hashlib.sha256(b"".join(k.image.bytes() for k in contents.kernels)).digest()
        network, parser, ok = _parse(b, logger, contents)
        assert ok, [parser.get_error(i).desc() for i in range(parser.num_errors)]
        plugins = [network.get_layer(i) for i in range(network.num_layers)
                   if network.get_layer(i).type == trt.LayerType.PLUGIN_V3]
        assert plugins, f"{contents.part}: no GroupedMM plugin layer in the parsed network"
        config = b.create_builder_config()
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.SM86, 0)
        profile = b.create_optimization_profile()
        for spec in contents.inputs:
            ranges = [(d.min, d.opt, d.max) if d.size is None else (d.size,) * 3 for d in spec.dims]
            profile.set_shape(spec.name, *[tuple(r[i] for r in ranges) for i in range(3)])
        config.add_optimization_profile(profile)
        serialized = b.build_serialized_network(network, config)
        assert serialized is not None, f"{contents.part}: TensorRT for RTX could not build the engine"
        plan = bytes(serialized)
        assert ident in plan  # each plugin's reference
        largest = max(contents.kernels, key=lambda k: k.image.size).image.bytes()
        middle = len(largest) // 2
        assert largest[middle:middle + 512] not in plan, f"{contents.part}: the plan still carries kernel images"


def _trt_log(capfd) -> str:
    """What TensorRT's Python logger printed (to stdout), with stderr."""
    captured = capfd.readouterr()
    return captured.out + captured.err


def _create(b, fields, phase):
    creator = b.get_plugin_registry().get_creator("GroupedMM", "1", "et_trt")
    assert creator is not None, "the plugin library registered no et_trt::GroupedMM v1"
    return creator.create_plugin("grouped_mm", trt.PluginFieldCollection(fields), phase)


def test_a_reference_no_loaded_blob_holds_is_refused(builder, capfd):
    b, _, _ = builder
    unknown = np.frombuffer(os.urandom(32), np.uint8)
    field = trt.PluginField("kernel_images_id", unknown, trt.PluginFieldType.UNKNOWN)
    assert _create(b, [field], trt.TensorRTPhase.RUNTIME) is None
    log = _trt_log(capfd)
    assert f"the engine's kernel images {unknown.tobytes().hex()} are not loaded" in log, log


def test_a_reference_of_the_wrong_size_is_refused(builder, capfd):
    b, _, _ = builder
    field = trt.PluginField("kernel_images_id", np.zeros(31, np.uint8), trt.PluginFieldType.UNKNOWN)
    assert _create(b, [field], trt.TensorRTPhase.RUNTIME) is None
    assert "field kernel_images_id must be 32 bytes (a sha256), got 31" in _trt_log(capfd)


def test_kernel_images_that_do_not_match_the_blob_are_not_registered(builder, example_pte):
    _, _, lib = builder
    contents = _partitions(example_pte)[0]
    image = contents.kernels[0].image
    damaged = bytearray(image.bytes())
    damaged[len(damaged) // 2] ^= 0x20
    image.data = bytes(damaged)
    with pytest.raises(RuntimeError, match=rf"kernel image 0 \(named data {image.key}, {image.size} bytes\): its "
                                           r"sha256 is [0-9a-f]{16}\.\.\., the blob's"):
        runtime.use_kernel_images(lib, contents)


def test_parsing_without_kernel_images_fails_with_the_parser_message(builder, example_pte, capfd):
    """Images are handed per thread: a thread that was given none cannot create the plugin."""
    b, logger, _ = builder
    contents = _partitions(example_pte)[0]
    result = {}

    def parse():
        _, parser, ok = _parse(b, logger, contents)
        result["ok"], result["errors"] = ok, [parser.get_error(i).desc() for i in range(parser.num_errors)]

    thread = threading.Thread(target=parse)
    thread.start()
    thread.join()
    assert result["ok"] is False and result["errors"], result
    # The example's MoE blocks are MoEExperts nodes (fused_experts), which resolve their images as GroupedMM's do.
    assert "no kernel images: a MoEExperts node from ONNX takes the images of the blob being parsed" in \
        _trt_log(capfd)
