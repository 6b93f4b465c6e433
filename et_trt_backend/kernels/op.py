"""Eager custom op torch.ops.et_trt.grouped_mm: the AOT kernel from PyTorch, no Triton at run time.

    out = torch.ops.et_trt.grouped_mm(a, b, offs, trans_b)
    out = torch.ops.et_trt.grouped_mm(a, b_q, offs, True, b_scale)     # fp8 weights
    out = torch.ops.et_trt.grouped_mm(a, b_packed, offs, True, b_scale, group_size)   # int4 weights
a [rows, K], b [G, K, N] (trans_b False) or [G, N, K] (trans_b True), offs int32 [G]
on the GPU; bf16 or fp16; out [rows, N] with contract 4's semantics (rows past the
last offset are zero, any offs is safe). FP8 weights: b_q float8_e4m3fn [G, N, K]
(trans_b True) with b_scale float32 [G, N]; a is quantized per row on the GPU into a
workspace this op allocates (grouped_mm_launcher.h has the arithmetic). INT4 weights
(et_trt_backend/int4_weights.py): b_packed uint8 [G, N, round_up(K, 32) / 2] (trans_b True) with
b_scale bfloat16 [G, N, ceil(K / group_size)] and group_size 32, 64 or 128.

Kernel images come from the JSON file named by $ET_TRT_KERNEL_IMAGES
(images.save_images), else from compiling for the GPU's architecture with Triton
(aot.grouped_mm_images). The launcher library is found as launcher.library_path() says.
"""

from __future__ import annotations

import logging
import os

import torch

from et_trt_backend import int4_weights
from et_trt_backend.kernels import aot
from et_trt_backend.kernels.images import load_images
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.kernels.launcher import Fp8Operands, GroupedMMLauncher, Int4Operands, fp8_workspace_bytes

logger = logging.getLogger(__name__)

IMAGES_ENV = "ET_TRT_KERNEL_IMAGES"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_launchers: dict[tuple[int, str, bool, str], GroupedMMLauncher] = {}


def _images_for(device: torch.device, dtype: str, trans_b: bool, weight_format: str = "dense") -> list[KernelImage]:
    if os.environ.get(IMAGES_ENV):
        pool = load_images(os.environ[IMAGES_ENV])
    else:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        logger.info("compiling grouped_mm kernel images for %s with Triton", arch)
        pool = aot.grouped_mm_images([arch], dtype, trans_b, weight_format)
    return [i for i in pool if i.dtype == dtype and i.trans_b == trans_b and i.weight_format == weight_format
            and not i.kernel.startswith("moe_")]  # the MoE experts' images are moe_op's


def _launcher(device: torch.device, dtype: str, trans_b: bool, weight_format: str = "dense") -> GroupedMMLauncher:
    key = (device.index, dtype, trans_b, weight_format)
    if key not in _launchers:
        images = _images_for(device, dtype, trans_b, weight_format)
        if not images:
            raise RuntimeError(f"et_trt.grouped_mm: no kernel images for dtype {dtype}, trans_b={trans_b}, "
                               f"{weight_format} weights")
        with torch.cuda.device(device):
            _launchers[key] = GroupedMMLauncher(images)
    return _launchers[key]


def _check(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool,
           b_scale: torch.Tensor | None = None, group_size: int = 0) -> tuple[int, int, int, int]:
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(f"et_trt.grouped_mm: a must be [rows, K] and b [G, K, N] or [G, N, K]; got {tuple(a.shape)} and {tuple(b.shape)}")
    if group_size or b.dtype in (torch.uint8, torch.int8):
        return _check_int4(a, b, offs, trans_b, b_scale, group_size)
    if b.dtype == torch.float8_e4m3fn or b_scale is not None:
        _check_fp8(a, b, trans_b, b_scale)
    elif a.dtype not in _DTYPES or b.dtype != a.dtype:
        raise ValueError(f"et_trt.grouped_mm: a and b must both be bfloat16 or float16 (or b float8_e4m3fn with "
                         f"b_scale); got {a.dtype} and {b.dtype}")
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.shape[0] != b.shape[0]:
        raise ValueError(f"et_trt.grouped_mm: offs must be int32 [G] with G = b.shape[0] = {b.shape[0]}; got {offs.dtype} {tuple(offs.shape)}")
    rows, k = a.shape
    groups = b.shape[0]
    n, kb = (b.shape[1], b.shape[2]) if trans_b else (b.shape[2], b.shape[1])
    if kb != k:
        raise ValueError(f"et_trt.grouped_mm: K of a ({k}) and b ({kb}) differ (trans_b={trans_b})")
    return rows, k, n, groups


def _check_int4(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool, b_scale: torch.Tensor | None,
                group_size: int) -> tuple[int, int, int, int]:
    """The int4 form: b packed uint8 [G, N, Kp / 2], trans_b True, b_scale bf16 [G, N, ceil(K / group_size)]."""
    if not trans_b or b_scale is None or a.dtype not in _DTYPES:
        raise ValueError("et_trt.grouped_mm: int4 weights are b packed uint8 [G, N, round_up(K, 32) / 2] with "
                         "trans_b=True, b_scale bfloat16 [G, N, ceil(K / group_size)] and group_size, a bfloat16 or "
                         f"float16; got trans_b={trans_b}, b_scale {None if b_scale is None else b_scale.dtype}, "
                         f"a {a.dtype}")
    try:
        groups, n = int4_weights.check(b, b_scale, a.shape[1], group_size)
    except ValueError as e:
        raise ValueError(f"et_trt.grouped_mm: {e}") from None
    if offs.dtype != torch.int32 or tuple(offs.shape) != (groups,):
        raise ValueError(f"et_trt.grouped_mm: offs must be int32 [G] with G = {groups}; got {offs.dtype} "
                         f"{tuple(offs.shape)}")
    return a.shape[0], a.shape[1], n, groups


def _check_fp8(a: torch.Tensor, b: torch.Tensor, trans_b: bool, b_scale: torch.Tensor | None) -> None:
    """The fp8 form: b float8_e4m3fn [G, N, K], trans_b True, b_scale float32 [G, N], a bf16 or fp16."""
    form = "fp8 weights are b float8_e4m3fn [G, N, K] with trans_b=True and b_scale float32 [G, N]"
    if b.dtype != torch.float8_e4m3fn or b_scale is None:
        raise ValueError(f"et_trt.grouped_mm: {form}; got b {b.dtype} and b_scale "
                         f"{'None' if b_scale is None else b_scale.dtype}")
    if not trans_b:
        raise ValueError(f"et_trt.grouped_mm: {form}; got trans_b=False (transpose [G, K, N] weights at export)")
    if a.dtype not in _DTYPES:
        raise ValueError(f"et_trt.grouped_mm: with fp8 weights a must be bfloat16 or float16; got {a.dtype}")
    if b_scale.dtype != torch.float32 or tuple(b_scale.shape) != tuple(b.shape[:2]):
        raise ValueError(f"et_trt.grouped_mm: {form}; got b_scale {b_scale.dtype} {tuple(b_scale.shape)} for b "
                         f"{tuple(b.shape)}")


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """The launcher takes dense row-major tensors with 16-byte aligned storage."""
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.contiguous().clone()


@torch.library.custom_op("et_trt::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool = False,
               b_scale: torch.Tensor | None = None, group_size: int = 0) -> torch.Tensor:
    rows, k, n, groups = _check(a, b, offs, trans_b, b_scale, group_size)
    tensors = (a, b, offs) if b_scale is None else (a, b, offs, b_scale)
    if not all(t.is_cuda for t in tensors) or len({t.device for t in tensors}) != 1:
        raise ValueError("et_trt.grouped_mm: a, b, offs (and b_scale) must be on one CUDA device")
    a, b, offs = (_aligned(t) for t in (a, b, offs))
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    if b_scale is None:
        launcher = _launcher(a.device, _DTYPES[a.dtype], trans_b)
        launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, trans_b,
                        stream)
        return out
    b_scale = _aligned(b_scale)
    if group_size:
        _launcher(a.device, _DTYPES[a.dtype], trans_b, "int4").launch(
            a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, trans_b, stream,
            int4=Int4Operands(b_scale.data_ptr(), group_size))
        return out
    launcher = _launcher(a.device, _DTYPES[a.dtype], trans_b, "fp8")
    # The caching allocator's blocks are 512-byte aligned; the workspace lives until the stream is done with it.
    workspace = torch.empty(max(fp8_workspace_bytes(rows, k), 1), dtype=torch.uint8, device=a.device)
    launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, trans_b, stream,
                    Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), workspace.numel()))
    return out


@grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool = False,
      b_scale: torch.Tensor | None = None, group_size: int = 0) -> torch.Tensor:
    rows, _, n, _ = _check(a, b, offs, trans_b, b_scale, group_size)
    return a.new_empty((rows, n))
