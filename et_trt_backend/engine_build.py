"""Build the TensorRT engine at export, where TensorRT and a GPU are present.

The engine is built from the partition's ONNX with its options exactly as the
runtime would build it on the device (same BuildOptions): one optimization
profile from the IO specs' dynamic ranges, precision flags, workspace limit,
builder optimization level and timing cache. Where TensorRT or a GPU is
absent, the engine is left to the device (engine_build "auto"/"never") or the
export fails (engine_build "always"). Nothing here pretends to build.
"""

from __future__ import annotations

import logging
import os

from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization.blob import EngineRecord, TensorSpec

logger = logging.getLogger(__name__)


class EngineBuildError(RuntimeError):
    """The engine could not be built at export; the message says why and what to do."""


def unavailable_reason() -> str | None:
    """Why an engine cannot be built here (None: TensorRT and a GPU are present)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        return f"the TensorRT Python module (tensorrt) does not import here ({e})"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to PyTorch here"
    return None


def maybe_build_engine(onnx: bytes, inputs: list[TensorSpec], options: CompileOptions, part: str,
                       plugin_needed: bool) -> EngineRecord | None:
    """The engine per options.engine_build, or None when the device will build it."""
    if options.engine_build == "never":
        logger.info("part %r: engine_build = never; the device builds the engine from the ONNX", part)
        return None
    reason = unavailable_reason()
    if reason is not None:
        if options.engine_build == "always":
            raise EngineBuildError(
                f"part {part!r}: engine_build = always, but {reason}. Export on a machine with TensorRT "
                "and an NVIDIA GPU, or set engine_build = \"auto\" to let the device build the engine"
            )
        logger.info("part %r: no engine at export (%s); the device will build it from the ONNX", part, reason)
        return None
    return build_engine(onnx, inputs, options, part, plugin_needed)


def _load_plugin() -> None:
    # The GroupedMM plugin lives in the et-trt runtime library; TensorRT's ONNX
    # parser finds it by name once the library is loaded.
    from et_trt_backend import runtime

    runtime.load()


def build_engine(onnx: bytes, inputs: list[TensorSpec], options: CompileOptions, part: str,
                 plugin_needed: bool) -> EngineRecord:
    """Build a serialized engine with TensorRT (requires tensorrt and a GPU)."""
    import tensorrt as trt
    import torch

    if plugin_needed:
        _load_plugin()
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(onnx):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"part {part!r}: TensorRT's ONNX parser rejected the model: {errors}")

    config = builder.create_builder_config()
    if options.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    elif options.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    if options.tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    config.builder_optimization_level = options.optimization_level

    profile = builder.create_optimization_profile()
    for spec in inputs:
        shapes = [[d.min if d.size is None else d.size for d in spec.dims],
                  [d.opt if d.size is None else d.size for d in spec.dims],
                  [d.max if d.size is None else d.size for d in spec.dims]]
        profile.set_shape(spec.name, *shapes)
    config.add_optimization_profile(profile)

    cache_path = options.timing_cache
    if cache_path:
        cached = b""
        if os.path.exists(cache_path):
            with open(cache_path, "rb") as f:
                cached = f.read()
        config.set_timing_cache(config.create_timing_cache(cached), ignore_mismatch=False)

    device = torch.cuda.get_device_properties(torch.cuda.current_device())
    logger.info("part %r: building the TensorRT %s engine for %s (optimization level %d)",
                part, trt.__version__, device.name, options.optimization_level)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(f"part {part!r}: TensorRT failed to build the engine (see its log above)")
    if cache_path:
        with open(cache_path, "wb") as f:
            f.write(memoryview(config.get_timing_cache().serialize()))
    return EngineRecord(
        plan=bytes(plan),
        tensorrt_version=trt.__version__,
        gpu_name=device.name,
        compute_capability=device.major * 10 + device.minor,
    )
