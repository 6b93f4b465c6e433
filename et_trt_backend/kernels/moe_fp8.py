"""Triton source of the fused MoE experts' two GEMMs with FP8 weights (expert_precision "fp8"; the dense form and
the route and combine kernels they run between are moe_experts.py's).

Weights are float8 e4m3 with one float32 scale per expert output channel (et_trt_backend/quantization.py's
quantize_weights_fp8: w_gate_up [E, N1, H] with w_gate_up_scale [E, N1], w_down [E, H, F] with w_down_scale
[E, H]); hidden is quantized per token (scale = the row's amax / 448), the down GEMM's input in blocks of one row by
128 columns (the block's amax / 448), so the products run on FP8 tensor cores and nothing runs between the GEMMs:

  moe_fp8_route_kernel    moe_experts.py's route in its first programs; the others quantize hidden [T, H] (bf16/fp16)
                          to e4m3 xq [T, H] with scales xs [T]: once per token, not per pair or per column block of
                          the gate+up GEMM, and in the same launch
  moe_fp8_gate_up_kernel  gathers the rows of xq by pair (no permuted copy) and accumulates their FP8 products in
                          float32, both scales applied once at the end (a per-token scale keeps the accumulators in
                          the MMA: 1 x 128 blocks would add each K step's product scaled, a second tile of
                          registers that rules out 128-row tiles). Its
                          epilogue rounds the gate+up output to the part's dtype, applies the activation, rounds
                          that, and writes it as the down GEMM's input: e4m3 h [pairs, F] with a scale per row and
                          128 features h_scale [pairs, cdiv(F, 128)] (BLOCK_N = 128: one program owns a block)
  moe_fp8_down_kernel     y[pairs[r]] = topk_weights * (h[r] @ w_down[e]^T * scales (+ bias)), float32, as the
                          dense down kernel writes it; each K step (BLOCK_K, within one block) adds its FP8 product
                          scaled by its rows' block scales to the float32 accumulator (DeepGEMM's promotion; it
                          keeps the MMA from accumulating: on an H100 at the MoE shapes the down runs at 363 TFLOP/s,
                          the gate+up at 658, benchmarks/results/h100_moe_fp8acc/)

So a block is these three and moe_experts.py's moe_combine: four launches, as the dense form's.
Quantization: amax over the row or block (masked columns are zeros), scale = amax / 448 (1 where amax is 0),
q = e4m3(clamp(x / scale, +-448)) rounded to nearest even, both divisions IEEE (quantize_rows.py's quotients, the
form of quantization.py and moe_experts_fp8.reference). Triton's `/` on float32 is div.full.f32 (up to 2 ulps off):
with it a quotient near an e4m3 tie rounded one step off the reference's, and where that moved a gate+up output's
block amax by a bf16 ulp every value of the block rounded anew (4.5e-2 off at one token on an H100).
"""

import triton
import triton.language as tl

from et_trt_backend.kernels.moe_experts import (
    _gate_up_activation,
    _gate_up_products,
    _gate_up_tile,
    _m_tile,
    _store_weighted_rows,
    moe_route_kernel,
)
from et_trt_backend.kernels.quantize_rows import _quantized, _row_scales

SCALE_BLOCK = tl.constexpr(128)  # columns of h per scale


@triton.jit
def _quantize(x, amax):
    """(e4m3 of rows x [rows, cols] scaled by their amax [rows], the scales): quantize_rows.py's IEEE quotients."""
    scale, divisor, inverse, lift = _row_scales(amax)
    return _quantized(x, divisor, inverse, lift), scale


@triton.jit
def moe_fp8_route_kernel(ids_ptr, offs_ptr, sorted_ptr, tiles_ptr, pairs, E, block_m, x_ptr, xq_ptr, xs_ptr, T, H,
                         route_programs, CHUNK: tl.constexpr, E_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    """Programs [0, route_programs): moe_route_kernel's; then one per BLOCK_T tokens of hidden, which it reads twice
    (each row's amax, then the quotients: the second read hits L2)."""
    program = tl.program_id(0)
    if program < route_programs:
        moe_route_kernel(ids_ptr, offs_ptr, sorted_ptr, tiles_ptr, pairs, E, block_m, CHUNK, E_PAD)
    else:
        rt = (program - route_programs) * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = rt.to(tl.int64)[:, None] * H
        amax = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for k in range(0, H, SCALE_BLOCK):
            rk = k + tl.arange(0, SCALE_BLOCK)
            mask = (rt < T)[:, None] & (rk < H)[None, :]
            amax = tl.maximum(amax, tl.max(tl.abs(tl.load(x_ptr + rows + rk[None, :], mask=mask, other=0.0)
                                                  .to(tl.float32)), 1))
        scale, divisor, inverse, lift = _row_scales(amax)
        tl.store(xs_ptr + rt, scale, mask=rt < T)
        for k in range(0, H, SCALE_BLOCK):
            rk = k + tl.arange(0, SCALE_BLOCK)
            mask = (rt < T)[:, None] & (rk < H)[None, :]
            x = tl.load(x_ptr + rows + rk[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(xq_ptr + rows + rk[None, :], _quantized(x, divisor, inverse, lift), mask=mask)


@triton.jit
def moe_fp8_gate_up_kernel(xq_ptr, xs_ptr, sorted_ptr, w_ptr, w_scale_ptr, bias_ptr, tiles_ptr, offs_ptr, h_ptr,
                           h_scale_ptr, H, F, top_k, layout_block, activation, alpha, limit, has_bias,
                           GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
    tl.static_assert(BLOCK_N == SCALE_BLOCK)  # one program writes one scale block of its rows
    dtype = bias_ptr.dtype.element_ty
    expert, first, end = _m_tile(tiles_ptr, offs_ptr, BLOCK_M)
    if first < end:
        rm, row_ok, token, f, f_ok, rows_per_expert, gate_row = _gate_up_tile(sorted_ptr, first, end, F, top_k,
                                                                              layout_block, GATED, BLOCK_M, BLOCK_N)
        acc_g, acc_u = _gate_up_products(xq_ptr, token, row_ok, w_ptr, expert, rows_per_expert, gate_row, f_ok,
                                         layout_block, H, GATED, BLOCK_M, BLOCK_N, BLOCK_K)
        # The rows' scales (one per token) and the weight rows' (one per output channel), once.
        a_scale = tl.load(xs_ptr + token, mask=row_ok, other=0.0)[:, None]
        scale_base = w_scale_ptr + expert.to(tl.int64) * rows_per_expert
        acc_g *= a_scale * tl.load(scale_base + gate_row, mask=f_ok, other=0.0)[None, :]
        if GATED:
            acc_u *= a_scale * tl.load(scale_base + gate_row + layout_block, mask=f_ok, other=0.0)[None, :]
        # The gate+up output in the part's dtype, the activation in float32, its result in the part's dtype (as
        # the dense form), then quantized for the down GEMM; features past F are zeros, outside the block's amax.
        h = _gate_up_activation(acc_g, acc_u, bias_ptr, has_bias, expert, rows_per_expert, gate_row, layout_block,
                                f_ok, activation, alpha, limit, GATED).to(dtype).to(tl.float32)
        q, scale = _quantize(h, tl.max(tl.abs(tl.where(f_ok[None, :], h, 0.0)), 1))
        tl.store(h_ptr + rm.to(tl.int64)[:, None] * F + f[None, :], q, mask=row_ok[:, None] & f_ok[None, :])
        tl.store(h_scale_ptr + rm.to(tl.int64) * tl.cdiv(F, SCALE_BLOCK) + tl.program_id(1), scale, mask=row_ok)


@triton.jit
def moe_fp8_down_kernel(h_ptr, h_scale_ptr, sorted_ptr, w_ptr, w_scale_ptr, bias_ptr, weights_ptr, tiles_ptr,
                        offs_ptr, y_ptr, H, F, has_bias, weights_16bit, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tl.static_assert(SCALE_BLOCK % BLOCK_K == 0)  # a K step lies in one scale block
    expert, first, end = _m_tile(tiles_ptr, offs_ptr, BLOCK_M)
    if first < end:
        rm = first + tl.arange(0, BLOCK_M)
        row_ok = rm < end
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + rm.to(tl.int64)[:, None] * F + rk[None, :]
        s_ptrs = h_scale_ptr + rm.to(tl.int64) * tl.cdiv(F, SCALE_BLOCK)
        w_base = w_ptr + expert.to(tl.int64) * H * F
        w_ptrs = w_base + rn.to(tl.int64)[None, :] * F + rk[:, None]
        for k in range(0, tl.cdiv(F, BLOCK_K)):
            k_ok = k * BLOCK_K + rk < F
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            a_scale = tl.load(s_ptrs + k * BLOCK_K // SCALE_BLOCK, mask=row_ok, other=0.0)
            acc += tl.dot(a, tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)) * a_scale[:, None]
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        acc *= tl.load(w_scale_ptr + expert.to(tl.int64) * H + rn, mask=n_ok, other=0.0)[None, :]
        _store_weighted_rows(y_ptr, acc, sorted_ptr, rm, row_ok, rn, n_ok, bias_ptr, has_bias, expert, H, weights_ptr,
                             weights_16bit)
