"""Eager custom op torch.ops.et_trt.grouped_mm: the AOT kernel from PyTorch, no Triton at run time.

    out = torch.ops.et_trt.grouped_mm(a, b, offs, trans_b)
a [rows, K], b [G, K, N] (trans_b False) or [G, N, K] (trans_b True), offs int32 [G]
on the GPU; bf16 or fp16; out [rows, N] with contract 4's semantics (rows past the
last offset are zero, any offs is safe).

Kernel images come from the JSON file named by $ET_TRT_KERNEL_IMAGES
(images.save_images), else from compiling for the GPU's architecture with Triton
(aot.grouped_mm_images). The launcher library is found as launcher.library_path() says.
"""

from __future__ import annotations

import logging
import os

import torch

from et_trt_backend.kernels import aot
from et_trt_backend.kernels.images import KernelImage, load_images
from et_trt_backend.kernels.launcher import GroupedMMLauncher

logger = logging.getLogger(__name__)

IMAGES_ENV = "ET_TRT_KERNEL_IMAGES"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_launchers: dict[tuple[int, str, bool], GroupedMMLauncher] = {}


def _images_for(device: torch.device, dtype: str, trans_b: bool) -> list[KernelImage]:
    if os.environ.get(IMAGES_ENV):
        pool = load_images(os.environ[IMAGES_ENV])
    else:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        logger.info("compiling grouped_mm kernel images for %s with Triton", arch)
        pool = aot.grouped_mm_images([arch], dtype, trans_b)
    return [i for i in pool if i.dtype == dtype and i.trans_b == trans_b]


def _launcher(device: torch.device, dtype: str, trans_b: bool) -> GroupedMMLauncher:
    key = (device.index, dtype, trans_b)
    if key not in _launchers:
        images = _images_for(device, dtype, trans_b)
        if not images:
            raise RuntimeError(f"et_trt.grouped_mm: no kernel images for dtype {dtype}, trans_b={trans_b}")
        with torch.cuda.device(device):
            _launchers[key] = GroupedMMLauncher(images)
    return _launchers[key]


def _check(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool) -> tuple[int, int, int, int]:
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(f"et_trt.grouped_mm: a must be [rows, K] and b [G, K, N] or [G, N, K]; got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype not in _DTYPES or b.dtype != a.dtype:
        raise ValueError(f"et_trt.grouped_mm: a and b must both be bfloat16 or float16; got {a.dtype} and {b.dtype}")
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.shape[0] != b.shape[0]:
        raise ValueError(f"et_trt.grouped_mm: offs must be int32 [G] with G = b.shape[0] = {b.shape[0]}; got {offs.dtype} {tuple(offs.shape)}")
    rows, k = a.shape
    groups = b.shape[0]
    n, kb = (b.shape[1], b.shape[2]) if trans_b else (b.shape[2], b.shape[1])
    if kb != k:
        raise ValueError(f"et_trt.grouped_mm: K of a ({k}) and b ({kb}) differ (trans_b={trans_b})")
    return rows, k, n, groups


@torch.library.custom_op("et_trt::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool = False) -> torch.Tensor:
    rows, k, n, groups = _check(a, b, offs, trans_b)
    if not (a.is_cuda and b.is_cuda and offs.is_cuda) or len({a.device, b.device, offs.device}) != 1:
        raise ValueError("et_trt.grouped_mm: a, b and offs must be on one CUDA device")
    # The launcher takes dense row-major tensors with 16-byte aligned storage.
    a, b, offs = (t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.contiguous().clone() for t in (a, b, offs))
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    launcher = _launcher(a.device, _DTYPES[a.dtype], trans_b)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, trans_b, stream)
    return out


@grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool = False) -> torch.Tensor:
    rows, _, n, _ = _check(a, b, offs, trans_b)
    return a.new_empty((rows, n))
