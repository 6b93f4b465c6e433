"""Python binding (ctypes) of the C++ launchers' C ABI (runtime/kernels/grouped_mm_capi.h, moe_experts_capi.h).

Runs the ahead-of-time images with no Triton: the same code path as the
TensorRT plugin on the robot.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from collections.abc import Sequence
from typing import NamedTuple

from et_trt_backend import libraries
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.serialization import blob

LIBRARY_ENV = "ET_TRT_GROUPED_MM_LIB"
_LIBRARY_NAME = "libet_trt_grouped_mm.so"
# Where a source checkout's CMake builds put the library: the runtime's, the standalone
# runtime/kernels build, and benchmarks/device/run_all.sh's.
_BUILD_DIRS = ("runtime/build/kernels", "runtime/kernels/build", "build/kernels")


class LauncherError(RuntimeError):
    """The launcher refused the images or a launch; the message says why."""


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
        lib.et_trt_grouped_mm_create.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_launch.restype = ctypes.c_int32
        lib.et_trt_grouped_mm_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_launch_fp8.restype = ctypes.c_int32
        lib.et_trt_grouped_mm_launch_fp8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p,
            ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_launch_int4.restype = ctypes.c_int32
        lib.et_trt_grouped_mm_launch_int4.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_grouped_mm_fp8_workspace_bytes.restype = ctypes.c_size_t
        lib.et_trt_grouped_mm_fp8_workspace_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64]
        lib.et_trt_grouped_mm_last_kernel.restype = ctypes.c_char_p
        lib.et_trt_grouped_mm_last_kernel.argtypes = [ctypes.c_void_p]
        lib.et_trt_grouped_mm_last_quantize.restype = ctypes.c_char_p
        lib.et_trt_grouped_mm_last_quantize.argtypes = [ctypes.c_void_p]
        lib.et_trt_grouped_mm_destroy.argtypes = [ctypes.c_void_p]
        lib.et_trt_moe_experts_create.restype = ctypes.c_void_p
        lib.et_trt_moe_experts_create.argtypes = lib.et_trt_grouped_mm_create.argtypes
        lib.et_trt_moe_experts_launch.restype = ctypes.c_int32
        lib.et_trt_moe_experts_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(MoEExpertsArgs), ctypes.c_void_p,
                                                  ctypes.c_char_p, ctypes.c_size_t]
        lib.et_trt_moe_experts_workspace_bytes.restype = ctypes.c_size_t
        lib.et_trt_moe_experts_workspace_bytes.argtypes = [ctypes.c_int64] * 5
        lib.et_trt_moe_experts_last_kernels.restype = ctypes.c_char_p
        lib.et_trt_moe_experts_last_kernels.argtypes = [ctypes.c_void_p]
        lib.et_trt_moe_experts_destroy.argtypes = [ctypes.c_void_p]
        lib.et_trt_moe_experts_set_gemm_path.restype = ctypes.c_int32
        lib.et_trt_moe_experts_set_gemm_path.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.et_trt_moe_experts_set_int4_path.restype = ctypes.c_int32
        lib.et_trt_moe_experts_set_int4_path.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.et_trt_moe_experts_set_programmatic_launch.restype = ctypes.c_int32
        lib.et_trt_moe_experts_set_programmatic_launch.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.et_trt_moe_experts_rule_path.restype = ctypes.c_int32
        lib.et_trt_moe_experts_rule_path.argtypes = [ctypes.c_int64] * 5
        lib.et_trt_grouped_mm_images_for_gpu.restype = ctypes.c_int32
        lib.et_trt_grouped_mm_images_for_gpu.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32,
                                                         ctypes.POINTER(ctypes.c_uint8), ctypes.c_int32,
                                                         ctypes.c_char_p, ctypes.c_size_t]
        _lib = lib
    return _lib


class Fp8Operands(NamedTuple):
    """What a launch with fp8 weights needs beside the dense arguments (grouped_mm_launcher.h)."""

    b_scale: int  # device pointer, float32 [G, N]
    workspace: int  # device pointer, 256-byte aligned, >= fp8_workspace_bytes(rows, k) bytes
    workspace_bytes: int
    swiglu: bool = False  # a is a gate+up output [rows, 2K]; the GEMM's activations are its SwiGLU


def images_for_gpu(images: Sequence[KernelImage], compute_capability: int) -> list[KernelImage]:
    """The images the launcher loads on a GPU of `compute_capability` (major * 10 + minor): per kernel, the one
    that serves it best. No GPU needed."""
    if not images:
        return []
    kernels = blob.kernel_images_flatbuffer(images)
    chosen = (ctypes.c_uint8 * len(images))()
    error = ctypes.create_string_buffer(1024)
    if _library().et_trt_grouped_mm_images_for_gpu(kernels, len(kernels), compute_capability, chosen, len(images),
                                                   error, len(error)) != 0:
        raise LauncherError(error.value.decode())
    return [image for image, taken in zip(images, chosen) if taken]


class Int4Operands(NamedTuple):
    """What a launch with int4 weights needs beside the dense arguments (grouped_mm_launcher.h)."""

    b_scale: int  # device pointer, bfloat16 [G, N, ceil(K / group_size)]
    group_size: int


def fp8_workspace_bytes(rows: int, k: int) -> int:
    """round_up(rows * k, 256) + 4 * rows: quantized rows, then their float32 scales."""
    return _library().et_trt_grouped_mm_fp8_workspace_bytes(rows, k)


def _create(create, images: Sequence[KernelImage]) -> int:
    """A launcher handle from the C ABI's `create` for `images`; LauncherError with its message otherwise."""
    kernels = blob.kernel_images_flatbuffer(images)
    data = [i.image.bytes() for i in images]  # the C side reads them during create only
    pointers = (ctypes.c_char_p * len(data))(*data)
    sizes = (ctypes.c_size_t * len(data))(*(len(d) for d in data))
    error = ctypes.create_string_buffer(4096)
    handle = create(kernels, len(kernels), pointers, sizes, len(data), error, len(error))
    if not handle:
        raise LauncherError(error.value.decode())
    return handle


class GroupedMMLauncher:
    """Loads images for the current CUDA context's GPU; launch() takes raw device pointers."""

    def __init__(self, images: Sequence[KernelImage]):
        self.trans_b = bool(images) and images[0].trans_b
        self._handle = _create(_library().et_trt_grouped_mm_create, images)

    def launch(self, a: int, b: int, offs: int, out: int, rows: int, k: int, n: int, groups: int,
               trans_b: bool, stream: int, fp8: Fp8Operands | None = None, int4: Int4Operands | None = None) -> None:
        """Raw device pointers; `fp8` (b_scale and workspace pointers, workspace size) for fp8 weights, `int4`
        (b_scale pointer, group size) for int4 weights."""
        error = ctypes.create_string_buffer(2048)
        if int4 is not None:
            status = _library().et_trt_grouped_mm_launch_int4(
                self._handle, a, b, offs, out, rows, k, n, groups, int(trans_b), int4.b_scale, int4.group_size,
                stream, error, len(error))
        elif fp8 is None:
            status = _library().et_trt_grouped_mm_launch(
                self._handle, a, b, offs, out, rows, k, n, groups, int(trans_b), stream, error, len(error))
        else:
            status = _library().et_trt_grouped_mm_launch_fp8(
                self._handle, a, b, offs, out, rows, k, n, groups, int(trans_b), fp8.b_scale, fp8.workspace,
                fp8.workspace_bytes, int(fp8.swiglu), stream, error, len(error))
        if status != 0:
            raise LauncherError(error.value.decode())

    @property
    def last_kernel(self) -> str:
        return _library().et_trt_grouped_mm_last_kernel(self._handle).decode()

    @property
    def last_quantize(self) -> str:
        """With fp8 weights, the row quantization the last launch ran before its GEMM; "" otherwise."""
        return _library().et_trt_grouped_mm_last_quantize(self._handle).decode()

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.et_trt_grouped_mm_destroy(self._handle)
            self._handle = None


class MoEExpertsArgs(ctypes.Structure):
    """et_trt_moe_experts_args (runtime/kernels/moe_experts_capi.h): device pointers as ints, sizes, the
    activation's plugin_names.MOE_ACTIVATIONS value and the layout's index in plugin_names.MOE_GATE_UP_LAYOUTS; for
    INT4 weights their scales' pointers and the group size (None and 0 otherwise)."""

    _fields_ = [("hidden", ctypes.c_void_p), ("topk_ids", ctypes.c_void_p), ("topk_weights", ctypes.c_void_p),
                ("weights_fp32", ctypes.c_int32), ("w_gate_up", ctypes.c_void_p), ("w_down", ctypes.c_void_p),
                ("b_gate_up", ctypes.c_void_p), ("b_down", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("tokens", ctypes.c_int64), ("top_k", ctypes.c_int64), ("experts", ctypes.c_int64),
                ("hidden_size", ctypes.c_int64), ("ffn", ctypes.c_int64), ("activation", ctypes.c_int32),
                ("gate_up_layout", ctypes.c_int32), ("alpha", ctypes.c_float), ("limit", ctypes.c_float),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
                ("w_gate_up_scale", ctypes.c_void_p), ("w_down_scale", ctypes.c_void_p), ("group_size", ctypes.c_int64)]


def moe_workspace_bytes(tokens: int, top_k: int, experts: int, hidden_size: int, ffn: int) -> int:
    """The workspace one MoE experts launch needs (MoEExpertsLauncher::workspace_bytes)."""
    return _library().et_trt_moe_experts_workspace_bytes(tokens, top_k, experts, hidden_size, ffn)


MOE_GEMM_PATHS = ("rule", "wgmma", "tilings")  # MoEGemmPath's values, in order
MOE_INT4_PATHS = ("rule", "gemv", "mma", "tiles")  # MoEInt4Path's values, in order


def moe_rule_path(tokens: int, top_k: int, experts: int, hidden_size: int, ffn: int) -> str:
    """The launcher's dispatch rule for a block of these sizes (MoEExpertsLauncher::rule_path): "wgmma" where it
    takes sm_90a's wgmma GEMMs if they serve the launch, else "tilings". Needs no GPU."""
    return MOE_GEMM_PATHS[_library().et_trt_moe_experts_rule_path(tokens, top_k, experts, hidden_size, ffn)]


class MoEExpertsLauncher:
    """The fused MoE experts kernels' launcher for the current CUDA context's GPU (moe_experts_launcher.h)."""

    def __init__(self, images: Sequence[KernelImage]):
        self._handle = _create(_library().et_trt_moe_experts_create, images)

    def launch(self, args: MoEExpertsArgs, stream: int) -> None:
        error = ctypes.create_string_buffer(2048)
        if _library().et_trt_moe_experts_launch(self._handle, ctypes.byref(args), stream, error, len(error)) != 0:
            raise LauncherError(error.value.decode())

    def set_gemm_path(self, path: str) -> None:
        """The GEMMs later launches run: "rule" (the launcher's dispatch rule), "wgmma" (sm_90a's wgmma GEMMs
        wherever they serve) or "tilings" (the Triton tilings only)."""
        if path not in MOE_GEMM_PATHS:
            raise ValueError(f"unknown MoE GEMM path {path!r}; use one of {MOE_GEMM_PATHS}")
        _library().et_trt_moe_experts_set_gemm_path(self._handle, MOE_GEMM_PATHS.index(path))

    def set_int4_path(self, path: str) -> None:
        """The INT4 kernels later launches run: "rule" (the launcher's), "gemv" (the vector-matrix kernels), "mma"
        (the mma.sync kernels where hidden and FFN sizes are multiples of 16, else the rule's) or "tiles"."""
        if path not in MOE_INT4_PATHS:
            raise ValueError(f"unknown MoE INT4 path {path!r}; use one of {MOE_INT4_PATHS}")
        _library().et_trt_moe_experts_set_int4_path(self._handle, MOE_INT4_PATHS.index(path))

    def set_programmatic_launch(self, enabled: bool) -> None:
        """Whether later launches start the kernels whose images wait for the grid before them while that grid runs
        (programmatic dependent launch; on until set off: benchmarks time both)."""
        _library().et_trt_moe_experts_set_programmatic_launch(self._handle, int(enabled))

    @property
    def last_kernels(self) -> str:
        """The kernels the last launch ran, joined by " + "."""
        return _library().et_trt_moe_experts_last_kernels(self._handle).decode()

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.et_trt_moe_experts_destroy(self._handle)
            self._handle = None
