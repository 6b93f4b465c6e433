"""Sweep candidates for moe_fp8.py's FP8 down GEMM (benchmarks/device/prepare.py's FP8_DOWN_CANDIDATES), not yet
timed on a GPU: the same arguments, grid and results as moe_fp8_down_kernel, which ships.

On an H100 at the MoE shapes the shipped down runs at 363 TFLOP/s, the gate+up at 658
(benchmarks/results/h100_moe_fp8acc/). Its K loop adds each 128-column scale block's FP8 product, scaled by its rows'
block scales, to the float32 accumulator: in the sm_90a code each iteration issues the block's wgmma, waits for it
(wait_group 0) and only then promotes it, so the tensor cores idle during the promotion and the wait.

What Triton 3.9 allows (WGMMAPipeline.cpp, checked in the PTX and SASS of these builds): a dot whose result is used
in the loop is waited for right after it; a dot stays in flight only if its result goes to the next iteration alone
and is read there after such a wait. SPLIT_K builds the overlap from that: the second half of a block's K is left in
flight while the previous block's product is promoted. But the loop then carries the in-flight product into the
registers the next iteration promotes from, a copy at the loop's end that reads the wgmma's accumulator before its
wait, and ptxas serializes every wgmma of the kernel for it ("C7514: wgmma.mma_async instructions are serialized due
to non wgmma instructions reading accumulator registers"): a wait after each wgmma instruction. The device sweep
measures what is left. Two blocks per iteration (the first waited and promoted while the second is in flight)
spilled (255 registers with three 128 x 128 float32 tiles live) and Triton's scheduler moved the promotion after the
second dot, which brings back the copy; tl.range(warp_specialize=True) compiles on sm_90a with these pointer loads
but specializes nothing (no setmaxnreg, no mbarrier) and halves the stages. Overlap beyond this needs explicit
wgmma waits (Gluon's warpgroup_mma_wait, or CUDA as sm90.py's kernels).
"""

import triton
import triton.language as tl

from et_trt_backend.kernels.moe_experts import _m_tile, _store_weighted_rows
from et_trt_backend.kernels.moe_fp8 import SCALE_BLOCK


@triton.jit
def moe_fp8_down_candidate_kernel(h_ptr, h_scale_ptr, sorted_ptr, w_ptr, w_scale_ptr, bias_ptr, weights_ptr,
                                  tiles_ptr, offs_ptr, y_ptr, H, F, has_bias, weights_16bit, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """moe_fp8_down_kernel's arithmetic: one FP8 product per scale block, accumulated in the MMA from zero and
    promoted (scaled by its rows' block scales, added to the float32 accumulator) in block order; each block's scales
    loaded a block ahead. Without SPLIT_K: one dot of BLOCK_K = 128 per block, promoted at once (the shipped loop).
    SPLIT_K: two dots of BLOCK_K = 64 per block, the second accumulating onto the first in the MMA and left in flight
    into the next iteration, which promotes it after its own first dot (the module docstring)."""
    tl.static_assert(BLOCK_K * (2 if SPLIT_K else 1) == SCALE_BLOCK)
    expert, first, end = _m_tile(tiles_ptr, offs_ptr, BLOCK_M)
    if first < end:
        rm = first + tl.arange(0, BLOCK_M)
        row_ok = rm < end
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + rm.to(tl.int64)[:, None] * F + rk[None, :]
        s_ptrs = h_scale_ptr + rm.to(tl.int64) * tl.cdiv(F, SCALE_BLOCK)
        w_ptrs = w_ptr + expert.to(tl.int64) * H * F + rn.to(tl.int64)[None, :] * F + rk[:, None]
        blocks = tl.cdiv(F, SCALE_BLOCK)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SPLIT_K:
            # The previous block's product and its rows' scales; zeros before the first (0 * 0 adds nothing).
            product = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            scale = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k in range(0, blocks):
                low_ok = k * SCALE_BLOCK + rk < F
                high_ok = k * SCALE_BLOCK + BLOCK_K + rk < F
                a_low = tl.load(a_ptrs, mask=row_ok[:, None] & low_ok[None, :], other=0.0)
                w_low = tl.load(w_ptrs, mask=low_ok[:, None] & n_ok[None, :], other=0.0)
                a_high = tl.load(a_ptrs + BLOCK_K, mask=row_ok[:, None] & high_ok[None, :], other=0.0)
                w_high = tl.load(w_ptrs + BLOCK_K, mask=high_ok[:, None] & n_ok[None, :], other=0.0)
                next_scale = tl.load(s_ptrs + k, mask=row_ok, other=0.0)
                low = tl.dot(a_low, w_low)  # waited for at once: the second dot uses it
                next_product = tl.dot(a_high, w_high, low)  # left in flight into the next iteration
                acc += product * scale[:, None]
                product, scale = next_product, next_scale
                a_ptrs += SCALE_BLOCK
                w_ptrs += SCALE_BLOCK
            acc += product * scale[:, None]
        else:
            scale = tl.load(s_ptrs, mask=row_ok, other=0.0)
            for k in range(0, blocks):
                k_ok = k * SCALE_BLOCK + rk < F
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                # The next block's scales (the last block's again in the last iteration: unused).
                next_scale = tl.load(s_ptrs + tl.minimum(k + 1, blocks - 1), mask=row_ok, other=0.0)
                acc += tl.dot(a, w) * scale[:, None]
                scale = next_scale
                a_ptrs += SCALE_BLOCK
                w_ptrs += SCALE_BLOCK
        acc *= tl.load(w_scale_ptr + expert.to(tl.int64) * H + rn, mask=n_ok, other=0.0)[None, :]
        _store_weighted_rows(y_ptr, acc, sorted_ptr, rm, row_ok, rn, n_ok, bias_ptr, has_bias, expert, H, weights_ptr,
                             weights_16bit)
