"""Build the TensorRT engine at export, where TensorRT and a GPU are present.

The engine is built by the et-trt C++ runtime (runtime.build_engine), the same
builder the robot runs at init: same ONNX parser, BuildOptions, optimization
profile (from the IO specs' dynamic ranges) and GroupedMM plugin with the
blob's kernel images. One builder means an engine embedded at export is the
engine the device would have built. Where the runtime library, TensorRT, CUDA
or a GPU is missing, the device builds the engine (engine_build "auto"/"never")
or the export fails (engine_build "always"). Nothing here pretends to build.
"""

from __future__ import annotations

import logging

from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import blob

logger = logging.getLogger(__name__)


class EngineBuildError(RuntimeError):
    """The engine could not be built at export; the message says why and what to do."""


def _build(contents: blob.BlobContents) -> blob.EngineRecord:
    """Raises runtime.EngineBuildUnavailable / RuntimeLoadError where it cannot build here."""
    from et_trt_backend import runtime

    runtime.load()
    plan, version, gpu, capability = runtime.build_engine(blob.serialize(contents))
    return blob.EngineRecord(plan=plan, provider="tensorrt", tensorrt_version=version, gpu_name=gpu,
                             compute_capability=capability)


def maybe_build_engines(contents: blob.BlobContents, options: CompileOptions) -> list[blob.EngineRecord]:
    """The engines for the blob `contents` (its engines unset) per options.engine_build;
    empty when the device will build the engine from the ONNX."""
    from et_trt_backend.runtime import EngineBuildUnavailable, RuntimeLoadError

    part = contents.part
    if options.engine_build == "never":
        logger.info("part %r: engine_build = never; the device builds the engine from the ONNX", part)
        return []
    try:
        logger.info("part %r: building the TensorRT engine at export", part)
        engine = _build(contents)
    except (EngineBuildUnavailable, RuntimeLoadError) as e:
        if options.engine_build == "always":
            raise EngineBuildError(
                f"part {part!r}: engine_build = always, but no engine can be built here: {e}. Export on a "
                "machine with TensorRT, an NVIDIA GPU and the et-trt runtime built (scripts/build_runtime.sh), "
                "or set engine_build = \"auto\" to let the device build the engine"
            ) from e
        logger.info("part %r: no engine at export (%s); the device will build it from the ONNX", part, e)
        return []
    except RuntimeError as e:
        raise EngineBuildError(f"part {part!r}: TensorRT failed to build the engine: {e}") from e
    logger.info("part %r: engine built with TensorRT %s for %s (sm_%d), %.1f MiB", part,
                engine.tensorrt_version, engine.gpu_name, engine.compute_capability, len(engine.plan) / 2**20)
    return [engine]
