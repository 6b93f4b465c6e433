"""Eager custom op torch.ops.et_trt.moe_experts: the fused MoE experts kernels from PyTorch, no Triton at run time.

    out = torch.ops.et_trt.moe_experts(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                       activation="swiglu", gate_up_layout="concat", alpha=1.702, limit=7.0)

    out = torch.ops.et_trt.moe_experts(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                       activation, gate_up_layout, alpha, limit,
                                       w_gate_up_scale, w_down_scale, group_size)   # INT4 expert weights

    out = torch.ops.et_trt.moe_experts(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                       activation, gate_up_layout, alpha, limit,
                                       w_gate_up_scale, w_down_scale)               # FP8 expert weights

The MoEExperts op of et_trt_backend/moe_experts.py (its semantics and input rules; `reference` is the CPU
definition; INT4 weights: packed uint8 with bfloat16 group scales, int4_weights.moe_experts_reference; FP8 weights:
float8_e4m3fn with float32 scales per output channel, moe_experts_fp8.reference) on one CUDA
device, through the C++ launcher (runtime/kernels/moe_experts_launcher.h) and a
workspace this op allocates. Kernel images come from the JSON file named by $ET_TRT_KERNEL_IMAGES (its "moe_"
kernels), else from compiling for the GPU's architecture with Triton (moe_aot.moe_experts_images).
"""

from __future__ import annotations

import logging
import os

import torch

from et_trt_backend import int4_weights, moe_experts, moe_experts_fp8
from et_trt_backend.kernels import moe_aot
from et_trt_backend.kernels.images import load_images
from et_trt_backend.kernels.launcher import MoEExpertsArgs, MoEExpertsLauncher, moe_workspace_bytes
from et_trt_backend.kernels.op import IMAGES_ENV
from et_trt_backend.plugin_names import MOE_ACTIVATIONS, MOE_GATE_UP_LAYOUTS

logger = logging.getLogger(__name__)

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_launchers: dict[tuple[int, str, str], MoEExpertsLauncher] = {}
# Kernels whose images serve either weight format (they read no weights).
_ANY_FORMAT = ("moe_route", "moe_combine")


def launcher_for(device: torch.device, dtype: torch.dtype, weight_format: str = "dense") -> MoEExpertsLauncher:
    """The launcher of `dtype`'s images of `weight_format` ("dense", "int4" or "fp8") for `device` (made once
    each)."""
    key = (device.index, _DTYPES[dtype], weight_format)
    if key not in _launchers:
        if os.environ.get(IMAGES_ENV):
            pool = load_images(os.environ[IMAGES_ENV])
        else:
            major, minor = torch.cuda.get_device_capability(device)
            logger.info("compiling the MoE experts kernel images for sm_%d%d with Triton", major, minor)
            pool = moe_aot.moe_experts_images([f"sm_{major}{minor}"], key[1], weight_format)
        images = [i for i in pool if i.kernel.startswith("moe_") and i.dtype == key[1]
                  and (i.weight_format == weight_format or i.kernel in _ANY_FORMAT)]
        if not images:
            raise RuntimeError(f"et_trt.moe_experts: no MoE experts kernel images for dtype {key[1]}, "
                               f"{weight_format} weights")
        with torch.cuda.device(device):
            _launchers[key] = MoEExpertsLauncher(images)
    return _launchers[key]


def _aligned(t: torch.Tensor | None) -> torch.Tensor | None:
    """The launcher takes dense row-major tensors with 16-byte aligned storage."""
    return t if t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) else t.contiguous().clone()


def launch_args(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor, out: torch.Tensor, workspace: torch.Tensor, *, experts: int, ffn: int,
                b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, activation: str = "swiglu",
                gate_up_layout: str = "concat", alpha: float = moe_experts.GPTOSS_ALPHA,
                limit: float = moe_experts.GPTOSS_LIMIT, w_gate_up_scale: torch.Tensor | None = None,
                w_down_scale: torch.Tensor | None = None, group_size: int = 0) -> MoEExpertsArgs:
    """The launcher's arguments for one block on device tensors (None: no bias, no scale; `workspace`: uint8, at
    least moe_workspace_bytes). Tokens, top-k and hidden size come from the shapes of `hidden` and `topk_ids`;
    `experts` and `ffn` are given: packed INT4 weights' shapes do not say them, and a benchmark may tell the
    launcher of more experts than the weights hold."""
    def pointer(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    (tokens, size), top_k = hidden.shape, topk_ids.shape[1]
    return MoEExpertsArgs(
        hidden=hidden.data_ptr(), topk_ids=topk_ids.data_ptr(), topk_weights=topk_weights.data_ptr(),
        weights_fp32=int(topk_weights.dtype == torch.float32), w_gate_up=w_gate_up.data_ptr(),
        w_down=w_down.data_ptr(), b_gate_up=pointer(b_gate_up), b_down=pointer(b_down), out=out.data_ptr(),
        tokens=tokens, top_k=top_k, experts=experts, hidden_size=size, ffn=ffn, activation=MOE_ACTIVATIONS[activation],
        gate_up_layout=MOE_GATE_UP_LAYOUTS.index(gate_up_layout), alpha=alpha, limit=limit,
        workspace=workspace.data_ptr(), workspace_bytes=workspace.numel(), w_gate_up_scale=pointer(w_gate_up_scale),
        w_down_scale=pointer(w_down_scale), group_size=group_size)


@torch.library.custom_op("et_trt::moe_experts", mutates_args=())
def moe_experts_op(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                   w_down: torch.Tensor, b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None,
                   activation: str = "swiglu", gate_up_layout: str = "concat", alpha: float = moe_experts.GPTOSS_ALPHA,
                   limit: float = moe_experts.GPTOSS_LIMIT, w_gate_up_scale: torch.Tensor | None = None,
                   w_down_scale: torch.Tensor | None = None, group_size: int = 0) -> torch.Tensor:
    tokens, top_k, experts, size, ffn = _check(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                               activation, gate_up_layout, w_gate_up_scale, w_down_scale, group_size)
    tensors = [t for t in (hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                           w_down_scale) if t is not None]
    if not all(t.is_cuda for t in tensors) or len({t.device for t in tensors}) != 1:
        raise ValueError("et_trt.moe_experts: every input must be on one CUDA device")
    hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale, w_down_scale = (
        _aligned(t) for t in (hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                              w_down_scale))
    out = torch.empty((tokens, size), dtype=hidden.dtype, device=hidden.device)
    weight_format = _weight_format(w_gate_up, group_size)
    launcher = launcher_for(hidden.device, hidden.dtype, weight_format)
    scaled = weight_format != "dense"
    # The caching allocator's blocks are 512-byte aligned; the workspace lives until the stream is done with it.
    workspace = torch.empty(max(moe_workspace_bytes(tokens, top_k, experts, size, ffn), 1), dtype=torch.uint8,
                            device=hidden.device)
    args = launch_args(hidden, topk_ids, topk_weights, w_gate_up, w_down, out, workspace, experts=experts, ffn=ffn,
                       b_gate_up=b_gate_up, b_down=b_down, activation=activation, gate_up_layout=gate_up_layout,
                       alpha=alpha, limit=limit, w_gate_up_scale=w_gate_up_scale if scaled else None,
                       w_down_scale=w_down_scale if scaled else None, group_size=group_size)
    launcher.launch(args, torch.cuda.current_stream(hidden.device).cuda_stream)
    return out


@moe_experts_op.register_fake
def _(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up=None, b_down=None, activation="swiglu",
      gate_up_layout="concat", alpha=moe_experts.GPTOSS_ALPHA, limit=moe_experts.GPTOSS_LIMIT, w_gate_up_scale=None,
      w_down_scale=None, group_size=0):
    tokens, _, _, size, _ = _check(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation,
                                   gate_up_layout, w_gate_up_scale, w_down_scale, group_size)
    return hidden.new_empty((tokens, size))


def _weight_format(w_gate_up: torch.Tensor, group_size: int) -> str:
    if group_size:
        return "int4"
    return "fp8" if w_gate_up.dtype == moe_experts_fp8.FP8_DTYPE else "dense"


def _check(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation, gate_up_layout,
           w_gate_up_scale, w_down_scale, group_size) -> tuple[int, int, int, int, int]:
    """(T, k, E, H, F) of valid inputs, dense, (group_size given) INT4 or (float8_e4m3fn weights) FP8; a ValueError
    naming the input otherwise."""
    if _weight_format(w_gate_up, group_size) == "fp8":
        if w_gate_up_scale is None or w_down_scale is None:
            raise ValueError("et_trt.moe_experts: FP8 weights need w_gate_up_scale and w_down_scale "
                             "(moe_experts_fp8.quantize_weights)")
        return moe_experts_fp8.check_inputs(hidden, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down,
                                            w_down_scale, b_gate_up, b_down, activation, gate_up_layout)
    if not group_size:
        if w_gate_up_scale is not None or w_down_scale is not None:
            raise ValueError("et_trt.moe_experts: weight scales are given without a group_size (INT4 weights take "
                             "both)")
        return moe_experts.check_inputs(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                        activation, gate_up_layout)
    if w_gate_up_scale is None or w_down_scale is None:
        raise ValueError("et_trt.moe_experts: INT4 weights (group_size given) need w_gate_up_scale and w_down_scale")
    return int4_weights.check_moe_experts(hidden, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down,
                                         w_down_scale, b_gate_up, b_down, activation, gate_up_layout, group_size)
