"""The NVIDIA builders et-trt's C++ engine builder finds here: TensorRT and TensorRT for RTX.

The builder is libet_trt_plugin.so (runtime/src/tensorrt/builder_capi.h, built where TensorRT's
headers are given): the same code that builds engines on the robot at init, loaded with ctypes.
It opens the provider's libraries itself: TensorRT builds for the GPU it runs on; TensorRT for RTX
builds ahead of time, with no GPU, for the compute capabilities in RTX_TARGETS. Neither is a
dependency of et-trt (TensorRT for RTX is the `tensorrt-rtx` extra).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
import pathlib

from et_trt_backend import runtime
from et_trt_backend.serialization.blob import PROVIDERS

logger = logging.getLogger(__name__)

RTX_EXTRA = "pip install 'et-trt[tensorrt-rtx]'"
# kernel_archs entries TensorRT for RTX builds engines for at export, and the compute capability of each.
# It cannot target sm_87 (Orin), sm_90a (H100/H200), sm_100a or sm_110a (Thor).
RTX_TARGETS = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_120a": 120}
# The C entry points' provider ids.
PROVIDER_IDS = {"tensorrt": 0, "tensorrt_rtx": 1}


class BuilderUnavailable(RuntimeError):
    """No usable NVIDIA builder here; the message says what is missing and how to install it."""


@dataclasses.dataclass(frozen=True)
class Builder:
    """An NVIDIA builder the C++ builder library loads here."""

    provider: str  # a key of blob.PROVIDERS
    version: str  # the provider library's, e.g. "1.7.1.116"
    library: ctypes.CDLL  # libet_trt_plugin.so

    @property
    def name(self) -> str:
        return PROVIDERS[self.provider]

    @property
    def ahead_of_time(self) -> bool:
        """Builds for named compute capabilities with no GPU (TensorRT for RTX)."""
        return self.provider == "tensorrt_rtx"

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


# The C++ builder's messages, by level (builder_capi.h): its errors come back with the failed build, its
# progress and TensorRT's info are details; TensorRT's warnings are the user's.
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.WARNING, 2: logging.DEBUG, 3: logging.DEBUG}
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p)


@_LOG_CALLBACK
def _log(level: int, message: bytes) -> None:
    logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", message.decode(errors="replace"))


@functools.cache
def builder_library(path: pathlib.Path | None = None) -> ctypes.CDLL:
    """libet_trt_plugin.so at `path`, else where runtime.plugin_library_path() finds it, loaded once, its
    messages forwarded to logging. BuilderUnavailable if it is not built."""
    if path is None:
        try:
            path = runtime.plugin_library_path()
        except runtime.RuntimeLoadError as e:
            raise BuilderUnavailable(f"et-trt's engine builder is not built here: {e}") from None
    runtime.point_at_tensorrt_rtx()  # read by the library when it first opens TensorRT for RTX
    try:
        lib = ctypes.CDLL(os.fspath(path))
    except OSError as e:
        raise BuilderUnavailable(f"cannot load et-trt's engine builder {path}: {e}") from None
    lib.et_trt_builder_set_log.argtypes = [_LOG_CALLBACK]
    lib.et_trt_builder_set_log(_log)
    lib.et_trt_builder_provider.restype = ctypes.c_int32
    lib.et_trt_builder_provider.argtypes = [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                            ctypes.c_size_t]
    return lib


def _builder(provider: str, library: pathlib.Path | None) -> Builder:
    lib = builder_library(library)
    version, error = ctypes.create_string_buffer(64), ctypes.create_string_buffer(4096)
    if lib.et_trt_builder_provider(PROVIDER_IDS[provider], version, len(version), error, len(error)) != 0:
        raise BuilderUnavailable(error.value.decode(errors="replace"))
    return Builder(provider, version.value.decode(), lib)


def tensorrt_rtx(library: pathlib.Path | None = None) -> Builder:
    """TensorRT for RTX, ready to build; BuilderUnavailable saying why not (not installed, its wheel's
    missing libtensorrt_rtx.so link, no builder library)."""
    return _builder("tensorrt_rtx", library)


def tensorrt(library: pathlib.Path | None = None) -> Builder:
    """TensorRT (libnvinfer); BuilderUnavailable saying why not."""
    return _builder("tensorrt", library)


def any_builder(library: pathlib.Path | None = None) -> Builder:
    """TensorRT where installed, else TensorRT for RTX; BuilderUnavailable naming why neither is usable."""
    reasons = []
    for find in (tensorrt, tensorrt_rtx):
        try:
            return find(library)
        except BuilderUnavailable as e:
            reasons.append(str(e))
    if len(set(reasons)) == 1:  # the builder library itself is missing
        raise BuilderUnavailable(reasons[0])
    raise BuilderUnavailable("no NVIDIA builder installed: " + "; ".join(reasons))
