"""Parse a partition's ONNX with NVIDIA's ONNX parser and build its engine: et-trt's C++ builder.

et_trt_build_engine (runtime/src/tensorrt/builder_capi.h) takes the blob and builds as init on
the robot does (runtime/src/tensorrt/tensorrt_builder.cc): a strongly typed network, the C++
GroupedMM and MoEExperts plugins with the blob's kernel images, the partition's build options, one optimization
profile from the blob's IO specs; with TensorRT for this GPU, or with TensorRT for RTX ahead of
time for a target of RTX_TARGETS. Nothing here configures a builder.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time

from et_trt_backend import runtime
from et_trt_backend.engines.providers import PROVIDER_IDS, RTX_TARGETS, Builder, BuilderUnavailable
from et_trt_backend.serialization import blob

_BUILT, _UNAVAILABLE, _PARSE_REFUSED = 0, 1, 2
_RECORD_SEPARATOR = "\x1e"  # between the failure and each of the parser's or builder's messages


class BuildFailed(RuntimeError):
    """The parser or the builder refused the partition; `errors` holds their messages verbatim,
    `parsed` whether the parser accepted it (a parse failure fails every target alike)."""

    def __init__(self, summary: str, errors: list[str], parsed: bool = True):
        super().__init__(summary + (":\n  " + "\n  ".join(errors) if errors else ""))
        self.errors, self.parsed = errors, parsed


@dataclasses.dataclass
class Engine:
    plan: bytes
    gpu_name: str  # the GPU it was built on; "" ahead of time (TensorRT for RTX)
    compute_capability: int  # the target: major * 10 + minor
    seconds: float
    options_not_applied: list[str]  # partition options this build did not apply, and why


def check_targets(builder: Builder, kernel_archs) -> tuple[list[str | None], str]:
    """The targets to check a partition's build for, and a note where they are not the partition's own:
    TensorRT builds for the GPU here; TensorRT for RTX for its targets in kernel_archs, or for sm_80 where
    kernel_archs names none (the network is checked; the device builds its own engine)."""
    if not builder.ahead_of_time:
        return [None], ""
    targets = [arch for arch in kernel_archs if arch in RTX_TARGETS]
    if targets:
        return targets, ""
    return ["sm_80"], (f"kernel_archs ({', '.join(kernel_archs)}) names no target {builder.name} builds for; "
                       "checked with an sm_80 build")


def _entry_point(library: ctypes.CDLL):
    fn = library.et_trt_build_engine
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, *runtime.NAMED_DATA_ARGTYPES, ctypes.c_int32, ctypes.c_int32,
                   ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p, ctypes.c_size_t,
                   ctypes.c_char_p, ctypes.c_size_t]
    library.et_trt_free.argtypes = [ctypes.c_void_p]
    return fn


def parse_and_build(builder: Builder, contents: blob.BlobContents, target: str | None, device: int = 0) -> Engine:
    """The engine of the partition `contents` (its named data attached) for `target`: a kernel_archs name in
    RTX_TARGETS for TensorRT for RTX, None (CUDA device `device` here) for TensorRT. BuildFailed with the
    parser's or builder's own messages if they refuse it; BuilderUnavailable where CUDA or a GPU is missing."""
    wanted = "a target in " + ", ".join(RTX_TARGETS) if builder.ahead_of_time else "no target (the GPU here)"
    if not (target in RTX_TARGETS if builder.ahead_of_time else target is None):
        raise ValueError(f"{builder} builds for {wanted}, not {target!r}")
    build = _entry_point(builder.library)
    data = blob.serialize(contents)
    plan, size, capability = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int32()
    gpu, not_applied, error = (ctypes.create_string_buffer(n) for n in (256, 4096, 1 << 16))
    start = time.perf_counter()
    rc = build(data, len(data), *runtime.named_data_arrays(contents), PROVIDER_IDS[builder.provider],
               RTX_TARGETS[target] if target is not None else 0, device,
               (contents.options.timing_cache or "").encode(), ctypes.byref(plan), ctypes.byref(size), gpu, len(gpu),
               ctypes.byref(capability), not_applied, len(not_applied), error, len(error))
    seconds = time.perf_counter() - start
    if rc != _BUILT:
        summary, *errors = error.value.decode(errors="replace").split(_RECORD_SEPARATOR)
        if rc == _UNAVAILABLE:
            raise BuilderUnavailable(summary)
        raise BuildFailed(summary, errors, parsed=rc != _PARSE_REFUSED)
    try:
        plan_bytes = ctypes.string_at(plan, size.value)
    finally:
        builder.library.et_trt_free(plan)
    return Engine(plan_bytes, gpu.value.decode(), capability.value, seconds,
                  not_applied.value.decode().splitlines())
