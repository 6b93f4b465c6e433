"""Python binding (ctypes) of the C++ launcher's C ABI (runtime/kernels/grouped_mm_capi.h).

Runs the ahead-of-time images with no Triton: the same code path as the
TensorRT plugin on the robot.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from collections.abc import Sequence

from et_trt_backend import libraries
from et_trt_backend.kernels.images import KernelImage

LIBRARY_ENV = "ET_TRT_GROUPED_MM_LIB"
_LIBRARY_NAME = "libet_trt_grouped_mm.so"
# Where a source checkout's CMake builds put the library: the runtime's, the standalone
# runtime/kernels build, and benchmarks/device/run_all.sh's.
_BUILD_DIRS = ("runtime/build/kernels", "runtime/kernels/build", "build/kernels")


class LauncherError(RuntimeError):
    """The launcher refused the images or a launch; the message says why."""


class _Image(ctypes.Structure):
    _fields_ = [
        ("kernel", ctypes.c_char_p), ("arch", ctypes.c_char_p), ("format", ctypes.c_int32),
        ("image", ctypes.c_void_p), ("image_size", ctypes.c_size_t), ("entry", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p), ("num_warps", ctypes.c_int32), ("shared_bytes", ctypes.c_int32),
        ("global_scratch_bytes", ctypes.c_int32), ("global_scratch_align", ctypes.c_int32),
        ("profile_scratch_bytes", ctypes.c_int32), ("block_m", ctypes.c_int32), ("block_n", ctypes.c_int32),
        ("block_k", ctypes.c_int32), ("persistent", ctypes.c_int32), ("ptx_version", ctypes.c_char_p),
    ]


def library_path() -> pathlib.Path:
    """The C-ABI library: $ET_TRT_GROUPED_MM_LIB, else the installed package's, else one a CMake
    build of this source checkout made."""
    if os.environ.get(LIBRARY_ENV):
        return pathlib.Path(os.environ[LIBRARY_ENV])
    path = libraries.find(_LIBRARY_NAME, _BUILD_DIRS)
    if path is None:
        raise LauncherError(
            f"{_LIBRARY_NAME} not found; build it (cmake -S runtime/kernels -B runtime/kernels/build && "
            f"cmake --build runtime/kernels/build, or scripts/build_runtime.sh) in a source checkout, install "
            f"et-trt with `pip install .`, or set {LIBRARY_ENV} to its path"
        )
    return path


_lib = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(library_path()))
        lib.et_trt_grouped_mm_create.restype = ctypes.c_void_p
        lib.et_trt_grouped_mm_create.argtypes = [ctypes.POINTER(_Image), ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_launch.restype = ctypes.c_int32
        lib.et_trt_grouped_mm_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_last_kernel.restype = ctypes.c_char_p
        lib.et_trt_grouped_mm_last_kernel.argtypes = [ctypes.c_void_p]
        lib.et_trt_grouped_mm_destroy.argtypes = [ctypes.c_void_p]
        _lib = lib
    return _lib


class GroupedMMLauncher:
    """Loads images for the current CUDA context's GPU; launch() takes raw device pointers."""

    def __init__(self, images: Sequence[KernelImage]):
        lib = _library()
        self.trans_b = bool(images) and images[0].trans_b
        self._keep = [i.image.bytes() for i in images]  # the C side borrows the bytes during create
        array = (_Image * len(images))(*[
            _Image(i.kernel.encode(), i.arch.encode(), 1 if i.format == "ptx" else 0,
                   ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p), len(data), i.entry.encode(),
                   i.dtype.encode(), i.num_warps, i.shared_bytes, i.global_scratch_bytes, i.global_scratch_align,
                   i.profile_scratch_bytes, i.block_m, i.block_n, i.block_k, int(i.persistent), i.ptx_version.encode())
            for i, data in zip(images, self._keep)
        ])
        error = ctypes.create_string_buffer(4096)
        self._handle = lib.et_trt_grouped_mm_create(array, len(images), error, len(error))
        if not self._handle:
            raise LauncherError(error.value.decode())

    def launch(self, a: int, b: int, offs: int, out: int, rows: int, k: int, n: int, groups: int,
               trans_b: bool, stream: int) -> None:
        error = ctypes.create_string_buffer(2048)
        status = _library().et_trt_grouped_mm_launch(
            self._handle, a, b, offs, out, rows, k, n, groups, int(trans_b), stream, error, len(error))
        if status != 0:
            raise LauncherError(error.value.decode())

    @property
    def last_kernel(self) -> str:
        return _library().et_trt_grouped_mm_last_kernel(self._handle).decode()

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.et_trt_grouped_mm_destroy(self._handle)
            self._handle = None
