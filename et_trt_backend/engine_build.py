"""Engines at export: which ones can be built here, built, as blob records.

Two providers can build at export (blob.PROVIDERS), both through et-trt's C++ engine
builder (engines/onnx_build.py), the builder the robot runs at init: same ONNX parser,
build options, optimization profile and plugins (GroupedMM, MoEExperts).
- TensorRT, where it and a GPU are present: the engine for this GPU.
- TensorRT for RTX, where installed (the `tensorrt-rtx` extra): one engine per target
  of kernel_archs it can build for (sm_80, sm_86, sm_89, sm_120a), ahead of time with
  no GPU.
Options a build does not apply are logged and recorded in the engine. Where no
engine can be built, the device builds it from the ONNX (engine_build "auto") or the
export fails (engine_build "always"). Nothing here pretends to build.
"""

from __future__ import annotations

import logging

from et_trt_backend.engines import onnx_build, providers
from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import blob

logger = logging.getLogger(__name__)


class EngineBuildError(RuntimeError):
    """The engine could not be built at export; the message says why and what to do."""


def _record(builder: providers.Builder, engine: onnx_build.Engine) -> blob.EngineRecord:
    return blob.EngineRecord(plan=blob.NamedData.of(engine.plan), provider=builder.provider,
                             tensorrt_version=builder.version, gpu_name=engine.gpu_name,
                             compute_capability=engine.compute_capability,
                             options_not_applied=engine.options_not_applied)


def _build(builder: providers.Builder, contents: blob.BlobContents, target: str | None) -> blob.EngineRecord:
    """One engine, logged with its target, time and size."""
    part = contents.part
    logger.info("part %r: building the %s engine for %s", part, builder, target or "this GPU")
    try:
        engine = onnx_build.parse_and_build(builder, contents, target)
    except onnx_build.BuildFailed as e:
        raise EngineBuildError(f"part {part!r}: {e}\nFix the model or its recipe, or set engine_build = \"never\" "
                               "to leave the engine to the device") from e
    logger.info("part %r: %s engine for %s built in %.2f s, %.1f MiB", part, builder,
                target or f"{engine.gpu_name} (sm_{engine.compute_capability})", engine.seconds, len(engine.plan) / 2**20)
    return _record(builder, engine)


def _tensorrt_engine(contents: blob.BlobContents, unavailable: list[str]) -> list[blob.EngineRecord]:
    """The TensorRT engine for this GPU; none (reason in `unavailable`) where the builder library, TensorRT, CUDA
    or a GPU is missing."""
    try:
        return [_build(providers.tensorrt(), contents, None)]
    except providers.BuilderUnavailable as e:
        unavailable.append(f"TensorRT: {e}")
        return []


def _tensorrt_rtx_engines(contents: blob.BlobContents, options: CompileOptions,
                          unavailable: list[str]) -> list[blob.EngineRecord]:
    """One TensorRT for RTX engine per target of kernel_archs it builds for; none (reason in `unavailable`)
    where it is not installed or no such target is asked for."""
    targets = [arch for arch in options.kernel_archs if arch in providers.RTX_TARGETS]
    if not targets:
        unavailable.append(f"TensorRT for RTX: kernel_archs ({', '.join(options.kernel_archs)}) names none of the "
                           f"targets it builds for ({', '.join(providers.RTX_TARGETS)})")
        return []
    try:
        builder = providers.tensorrt_rtx()
    except providers.BuilderUnavailable as e:
        unavailable.append(str(e))
        return []
    others = [arch for arch in options.kernel_archs if arch not in providers.RTX_TARGETS]
    if others:
        logger.info("part %r: %s cannot target %s; the device builds those engines from the ONNX", contents.part,
                    builder, ", ".join(others))
    return [_build(builder, contents, target) for target in targets]


def maybe_build_engines(contents: blob.BlobContents, options: CompileOptions) -> list[blob.EngineRecord]:
    """The engines for the blob `contents` (its engines unset) per options.engine_build;
    empty when the device will build the engine from the ONNX."""
    part = contents.part
    if options.engine_build == "never":
        logger.info("part %r: engine_build = never; the device builds the engine from the ONNX", part)
        return []
    unavailable: list[str] = []
    engines = _tensorrt_engine(contents, unavailable) + _tensorrt_rtx_engines(contents, options, unavailable)
    for note in dict.fromkeys(note for engine in engines for note in engine.options_not_applied):
        logger.warning("part %r: engines built at export do not apply option %s", part, note)
    if engines:
        return engines
    reasons = "; ".join(unavailable)
    if options.engine_build == "always":
        raise EngineBuildError(
            f"part {part!r}: engine_build = always, but no engine can be built here: {reasons}. Export where "
            "TensorRT, an NVIDIA GPU and et-trt's engine builder (libet_trt_plugin.so, built with TensorRT's headers: "
            "scripts/build_runtime.sh -DET_TRT_TENSORRT_INCLUDE_DIR=...) are, or install TensorRT for "
            f"RTX ({providers.RTX_EXTRA}) and name one of its targets in kernel_archs, or set engine_build = \"auto\" "
            "to let the device build the engine"
        )
    logger.info("part %r: no engine at export (%s); the device will build it from the ONNX", part, reasons)
    return []
