"""Sweep candidates for moe_fp8.py's FP8 down GEMM (benchmarks/device/prepare.py's FP8_DOWN_CANDIDATES), not yet
timed on a GPU: the same arguments, grid and results as moe_fp8_down_kernel, which ships.

On an H100 at the MoE shapes the shipped down runs at 363 TFLOP/s, the gate+up at 658
(benchmarks/results/h100_moe_fp8acc/). Its K loop adds each 128-column scale block's FP8 product, scaled by its rows'
block scales, to the float32 accumulator: in the sm_90a code each iteration issues the block's wgmma, waits for it
(wait_group 0) and only then promotes it, so the tensor cores idle during the promotion and the wait.

Triton (moe_fp8_down_candidate_kernel). Triton 3.9's wgmma pipeliner (WGMMAPipeline.cpp; checked in the PTX and SASS
of these builds) waits right after a dot whose result is used in the loop, and leaves a dot in flight only if its
result goes to the next iteration alone and is read there after such a wait. SPLIT_K builds an overlap from that
(the second half of a block's K in flight while the previous block is promoted), but the loop then copies the
in-flight product into the registers the next iteration promotes from, and ptxas serializes every wgmma of the kernel
for it ("C7514: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator
registers"): a wait after each wgmma instruction. Two blocks per iteration spilled (255 registers) and Triton's
scheduler moved the promotion after the second dot, which brings the copy back; tl.range(warp_specialize=True)
compiles on sm_90a with these pointer loads but specializes nothing (no setmaxnreg, no mbarrier) and halves the
stages.

Gluon (moe_fp8_down_wgmma_kernel): the waits are the kernel's own. STEP blocks per iteration: each block's wgmma is
issued before the previous one is waited for (wait_group 1) and promoted, and the last is waited for with
wait_group 0 before the loop's edge. ptxas (CUDA 13.0's, in Triton 3.9) serializes the wgmmas again (C7514) when a
wgmma stays in flight across the loop's edge to a wait_group 1 in the next iteration, although no instruction reads
its registers early (checked in the PTX); it also does if LLVM sinks a promotion past the next wgmma (an empty asm
that reads the accumulator keeps it in place). So per STEP blocks STEP - 1 promotions overlap a wgmma, and the
tensor cores drain once, against none and STEP in the shipped kernel. Gluon kernels do not run in Triton's
interpreter: the device sweep checks them against the FP8 reference first (benchmarks/moe_fp8_down_check.py).
"""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from et_trt_backend.kernels.moe_experts import _m_tile, _store_weighted_rows
from et_trt_backend.kernels.moe_fp8 import SCALE_BLOCK

SCALE_BLOCK_GL = gl.constexpr(128)  # SCALE_BLOCK, for the Gluon kernel


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


@gluon.jit
def _load_block(a_bufs, w_bufs, a_ptrs, w_ptrs, row_ok, n_ok, rk, block, F, STAGES: gl.constexpr):
    """cp.async of scale block `block`'s h rows and weight rows into its stage (zeros past F), one commit group."""
    k_ok = (block * SCALE_BLOCK_GL + rk < F)[None, :]
    stage = block % STAGES
    async_copy.async_load(a_bufs.index(stage), a_ptrs + block * SCALE_BLOCK_GL, mask=row_ok[:, None] & k_ok)
    async_copy.async_load(w_bufs.index(stage), w_ptrs + block * SCALE_BLOCK_GL, mask=n_ok[:, None] & k_ok)
    async_copy.commit_group()


@gluon.jit
def _block_product(a_bufs, w_bufs, a_ptrs, w_ptrs, row_ok, n_ok, rk, block, F, registers, STAGES: gl.constexpr):
    """Issues block `block`'s wgmma (from zero, into `registers`: a dead value's) once its stage has landed, after
    the loads of block + STAGES - 2 into the stage of block - 2 (whose wgmmas every warpgroup has waited for before
    this barrier)."""
    async_copy.wait_group(STAGES - 3)
    gl.barrier()
    fence_async_shared()
    _load_block(a_bufs, w_bufs, a_ptrs, w_ptrs, row_ok, n_ok, rk, block + STAGES - 2, F, STAGES)
    stage = block % STAGES
    return warpgroup_mma(a_bufs.index(stage), w_bufs.index(stage).permute((1, 0)), registers, use_acc=False,
                         is_async=True)


@gluon.jit
def _keep_before_next_wgmma(acc):
    """An empty asm with side effects reading acc: LLVM would otherwise sink a promotion's FMAs past the next wgmma,
    which then cannot take the promoted product's registers (a copy of an in-flight accumulator: C7514)."""
    gl.inline_asm("", ("f",), [acc], (), is_pure=False)


@gluon.jit
def moe_fp8_down_wgmma_kernel(h_ptr, h_scale_ptr, sorted_ptr, w_ptr, w_scale_ptr, bias_ptr, weights_ptr, tiles_ptr,
                              offs_ptr, y_ptr, H, F, has_bias, weights_16bit, BLOCK_M: gl.constexpr,
                              BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                              STEP: gl.constexpr):
    """moe_fp8_down_kernel's arithmetic (the same products and promotions in the same order) with the wgmma waits
    explicit (the module docstring): STEP blocks per iteration (past F they are zeros), cp.async loads in STAGES
    stages, STAGES - 2 blocks ahead; BLOCK_M = 16 rows per warp, BLOCK_K = 128 (a scale block), H and F multiples of
    16 (16-byte copies)."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_K == SCALE_BLOCK_GL and BLOCK_M == 16 * NUM_WARPS and STAGES >= 3 and STEP >= 2)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    rows_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8],
                                                 warps_per_cta=[NUM_WARPS, 1], order=[1, 0])
    a_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv)
    w_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float8e4nv)
    tile = gl.program_id(0)
    present = tile < gl.load(tiles_ptr)
    expert = gl.load(tiles_ptr + 1 + 2 * tile, mask=present, other=0)
    first = gl.load(tiles_ptr + 2 + 2 * tile, mask=present, other=0)
    end = gl.where(present, gl.minimum(gl.load(offs_ptr + expert), first + BLOCK_M), first)
    if first < end:
        blocks = gl.cdiv(F, BLOCK_K)
        rk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows_layout))
        rm_load = first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows_layout))
        rn_load = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rows_layout))
        row_load_ok = rm_load < end
        n_load_ok = rn_load < H
        a_ptrs = h_ptr + rm_load.to(gl.int64)[:, None] * F + rk[None, :]
        w_ptrs = w_ptr + expert.to(gl.int64) * H * F + rn_load.to(gl.int64)[:, None] * F + rk[None, :]
        a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], a_smem)
        w_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BLOCK_K], w_smem)
        for block in gl.static_range(STAGES - 2):
            _load_block(a_bufs, w_bufs, a_ptrs, w_ptrs, row_load_ok, n_load_ok, rk, block, F, STAGES)

        rm = first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        row_ok = rm < end
        s_ptrs = h_scale_ptr + rm.to(gl.int64) * blocks
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
        acc = zero
        for k in range(0, blocks, STEP):
            scale = gl.load(s_ptrs + k, mask=row_ok, other=0.0)
            product = _block_product(a_bufs, w_bufs, a_ptrs, w_ptrs, row_load_ok, n_load_ok, rk, k, F, zero, STAGES)
            for i in gl.static_range(1, STEP):
                next_scale = gl.load(s_ptrs + k + i, mask=row_ok & (k + i < blocks), other=0.0)
                if i == 1:
                    next_product = _block_product(a_bufs, w_bufs, a_ptrs, w_ptrs, row_load_ok, n_load_ok, rk, k + i,
                                                  F, zero, STAGES)
                else:  # into the registers of the product promoted last
                    next_product = _block_product(a_bufs, w_bufs, a_ptrs, w_ptrs, row_load_ok, n_load_ok, rk, k + i,
                                                  F, done, STAGES)
                done = warpgroup_mma_wait(num_outstanding=1, deps=[product])
                acc += done * scale[:, None]
                _keep_before_next_wgmma(acc)
                product, scale = next_product, next_scale
            done = warpgroup_mma_wait(num_outstanding=0, deps=[product])
            acc += done * scale[:, None]
        async_copy.wait_group(0)

        rn = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        n_ok = rn < H
        acc = acc * gl.load(w_scale_ptr + expert.to(gl.int64) * H + rn, mask=n_ok, other=0.0)[None, :]
        if has_bias:
            acc += gl.load(bias_ptr + expert.to(gl.int64) * H + rn, mask=n_ok, other=0.0).to(gl.float32)[None, :]
        pair = gl.load(sorted_ptr + rm, mask=row_ok, other=0)
        if weights_16bit:
            weight = gl.load(weights_ptr.to(gl.pointer_type(bias_ptr.dtype.element_ty), bitcast=True) + pair,
                             mask=row_ok, other=0.0).to(gl.float32)
        else:
            weight = gl.load(weights_ptr + pair, mask=row_ok, other=0.0)
        gl.store(y_ptr + pair.to(gl.int64)[:, None] * H + rn[None, :], acc * weight[:, None],
                 mask=row_ok[:, None] & n_ok[None, :])
