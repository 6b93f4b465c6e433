"""PyTorch ops the lowering rewrites routing and grouped GEMMs into.

Each op has a CPU implementation with the exact semantics its ONNX translation
(translations.py) has, so a rewritten graph can be run and checked in PyTorch,
and a fake implementation so rewritten programs can be re-traced. They live in
the namespace `et_trt_lowering` (the kernel's eager op owns `et_trt`).
"""

from __future__ import annotations

import torch

from et_trt_backend import int4_weights
from et_trt_backend import moe_experts as moe_semantics
from et_trt_backend import moe_experts_fp8 as fp8_semantics
from et_trt_backend.plugin_names import ACTIVATIONS
from et_trt_backend.quantization import FP8_DTYPE, grouped_mm_fp8_reference, swiglu_rows


@torch.library.custom_op("et_trt_lowering::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool) -> torch.Tensor:
    """GroupedMM of contract 4: rows [start_g, end_g) = a @ b[g]; uncovered rows are zero.

    end_g = clamp(offs[g], start_g, rows), start_{g+1} = end_g, so any offs is safe.
    b is [G, K, N], or [G, N, K] with trans_b (the weights as stored).
    """
    rows = a.shape[0]
    weights = b.transpose(-2, -1) if trans_b else b
    out = a.new_zeros(rows, weights.shape[-1])
    start = 0
    for g, end in enumerate(offs.tolist()):
        end = min(max(end, start), rows)
        if end > start:
            out[start:end] = (a[start:end].float() @ weights[g].float()).to(a.dtype)
        start = end
    return out


@grouped_mm.register_fake
def _(a, b, offs, trans_b):
    return a.new_empty(a.shape[0], b.shape[-2] if trans_b else b.shape[-1])


@torch.library.custom_op("et_trt_lowering::grouped_mm_fp8", mutates_args=())
def grouped_mm_fp8(a: torch.Tensor, b_q: torch.Tensor, offs: torch.Tensor, b_scale: torch.Tensor,
                   activation: int = 0) -> torch.Tensor:
    """The FP8 GroupedMM (quantization.py): a [rows, K] bf16/fp16, quantized per row at run time, times
    b_q [G, N, K] (e4m3 values; int8 where the ONNX carries their bits as INT8) scaled by b_scale
    float32 [G, N]; out [rows, N] in a's dtype, groups as grouped_mm's. activation 1
    (plugin_names.ACTIVATIONS["swiglu"]): a is a gate+up output [rows, 2K] and the rows quantized are its
    SwiGLU (quantization.swiglu_rows)."""
    if activation == ACTIVATIONS["swiglu"]:
        a = swiglu_rows(a)
    elif activation != ACTIVATIONS["none"]:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation}")
    weights = b_q.view(FP8_DTYPE)  # the same bits whichever 1-byte dtype carries them
    return grouped_mm_fp8_reference(a, weights, b_scale, offs).to(a.dtype)


@grouped_mm_fp8.register_fake
def _(a, b_q, offs, b_scale, activation=0):
    return a.new_empty(a.shape[0], b_q.shape[-2])


@torch.library.custom_op("et_trt_lowering::grouped_mm_int4", mutates_args=())
def grouped_mm_int4(a: torch.Tensor, b_packed: torch.Tensor, offs: torch.Tensor, b_scale: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """The INT4 GroupedMM (int4_weights.py): a [rows, K] bf16/fp16 times the weights [G, N, K] packed uint8
    [G, N, round_up(K, 32) / 2] with bfloat16 scales b_scale [G, N, ceil(K / group_size)]; float32 sums, out
    [rows, N] in a's dtype, groups as grouped_mm's."""
    return int4_weights.grouped_mm_reference(a, b_packed, b_scale, offs, group_size).to(a.dtype)


@grouped_mm_int4.register_fake
def _(a, b_packed, offs, b_scale, group_size):
    return a.new_empty(a.shape[0], b_packed.shape[-2])


@torch.library.custom_op("et_trt_lowering::counting_sort", mutates_args=())
def counting_sort(ids: torch.Tensor, num_bins: int, row_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable ascending sort of a 1-D tensor of integers in [0, num_bins): (values, indices).

    Equal to torch.sort(ids, stable=True) for such input. row_width k > 1
    promises that ids is [T, k] rows of distinct values, flattened (top-k
    expert ids); the ONNX form then counts per row, in T x E instead of
    T*k x E memory (translations.counting_sort).
    """
    one_hot = torch.nn.functional.one_hot(ids.long(), num_bins)
    rank = (one_hot.cumsum(0) * one_hot).sum(1) - 1
    counts = one_hot.sum(0)
    starts = counts.cumsum(0) - counts
    dest = starts[ids.long()] + rank
    indices = torch.empty_like(dest).scatter_(0, dest, torch.arange(ids.shape[0]))
    return ids[indices], indices


@counting_sort.register_fake
def _(ids, num_bins, row_width):
    return torch.empty_like(ids), torch.empty_like(ids, dtype=torch.long)


@torch.library.custom_op("et_trt_lowering::bounded_bincount", mutates_args=())
def bounded_bincount(ids: torch.Tensor, num_bins: int, row_width: int) -> torch.Tensor:
    """bincount of integers known to lie in [0, num_bins): a static output size.

    row_width as for counting_sort: k > 1 promises [T, k] rows of distinct ids.
    """
    return torch.nn.functional.one_hot(ids.long(), num_bins).sum(0)


@bounded_bincount.register_fake
def _(ids, num_bins, row_width):
    return ids.new_empty(num_bins, dtype=torch.long)


@torch.library.custom_op("et_trt_lowering::moe_experts", mutates_args=())
def moe_experts(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor, b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None, activation: str,
                gate_up_layout: str, alpha: float, limit: float) -> torch.Tensor:
    """The fused MoE experts (issue 32's MoEExperts, et_trt_backend/moe_experts.py): hidden [T, H], top-k ids
    [T, k] int32 and weights [T, k] -> the combined output [T, H]; weights as [E, out, in], activation and
    gate_up_layout by name (plugin_names.MOE_ACTIVATIONS, MOE_GATE_UP_LAYOUTS)."""
    return moe_semantics.reference(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                   activation=activation, gate_up_layout=gate_up_layout, alpha=alpha, limit=limit)


@moe_experts.register_fake
def _(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation, gate_up_layout, alpha,
      limit):
    return hidden.new_empty(hidden.shape)


@torch.library.custom_op("et_trt_lowering::moe_experts_int4", mutates_args=())
def moe_experts_int4(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     w_gate_up: torch.Tensor, w_down: torch.Tensor, b_gate_up: torch.Tensor | None,
                     b_down: torch.Tensor | None, w_gate_up_scale: torch.Tensor, w_down_scale: torch.Tensor,
                     activation: str, gate_up_layout: str, alpha: float, limit: float, group_size: int) -> torch.Tensor:
    """moe_experts with INT4 expert weights (int4_weights.moe_experts_reference): w_gate_up and w_down packed uint8,
    their bfloat16 group scales after the biases (the ONNX node's input order)."""
    return int4_weights.moe_experts_reference(
        hidden, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down, w_down_scale, b_gate_up, b_down,
        group_size=group_size, activation=activation, gate_up_layout=gate_up_layout, alpha=alpha, limit=limit,
    ).to(hidden.dtype)


@moe_experts_int4.register_fake
def _(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale, w_down_scale,
      activation, gate_up_layout, alpha, limit, group_size):
    return hidden.new_empty(hidden.shape)


@torch.library.custom_op("et_trt_lowering::moe_experts_fp8", mutates_args=())
def moe_experts_fp8(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                    w_down: torch.Tensor, b_gate_up: torch.Tensor, b_down: torch.Tensor, w_gate_up_scale: torch.Tensor,
                    w_down_scale: torch.Tensor, activation: str, gate_up_layout: str, alpha: float,
                    limit: float) -> torch.Tensor:
    """moe_experts with FP8 expert weights (et_trt_backend/moe_experts_fp8.py's reference): w_gate_up and w_down
    e4m3 [E, out, in], their float32 scales per output channel [E, out] after the biases (the ONNX node's order)."""
    return fp8_semantics.reference(
        hidden, topk_ids, topk_weights, (w_gate_up.view(FP8_DTYPE), w_gate_up_scale),
        (w_down.view(FP8_DTYPE), w_down_scale), b_gate_up, b_down, activation=activation,
        gate_up_layout=gate_up_layout, alpha=alpha, limit=limit,
    ).to(hidden.dtype)


@moe_experts_fp8.register_fake
def _(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale, w_down_scale,
      activation, gate_up_layout, alpha, limit):
    return hidden.new_empty(hidden.shape)
