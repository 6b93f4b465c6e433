"""Triton source of the grouped GEMM (the `aten._grouped_mm` MoE form).

    out[start_g:end_g] = a[start_g:end_g] @ B_g     for g in 0..G-1
    start_0 = 0, end_g = clamp(offs[g], start_g, rows), start_{g+1} = end_g
    every row of out not covered by a group is zero

a [rows, K], b [G, K, N] (TRANS_B = False) or [G, N, K] (TRANS_B = True, the
weights as stored), out [rows, N]: dense row-major, bf16 or fp16, float32
accumulation. The offsets are read on the GPU; nothing is read or written out of
bounds whatever they hold.

FP8 (the FP8 expert form, et_trt_backend/quantization.py): a and b are float8 e4m3,
quantized per row of a (a_scale [rows]) and per weight row (b_scale [G, N], TRANS_B
only); the epilogue scales the float32 products by both before rounding to out's
dtype. Dense images take the two scale pointers as None (they are not parameters).
INT4 (expert_precision "int4", et_trt_backend/int4_weights.py): b is packed INT4 [G, N, K] (TRANS_B only, pointer
loads, BLOCK_K 32: one packed chunk per step, int4_tiles.py) with bf16 group scales b_scale [G, N,
ceil(K / group_size)]; each chunk's float32 product is scaled by its group's scale. a_scale_ptr is None there.
The launcher runs int4_kernels.grouped_mm_int4_gemv_kernel instead for few rows per group.
WAIT_PRIOR_GRID (FP8 on sm_90+): the launcher starts the GEMM while the row quantization
still runs (programmatic stream serialization), so the launch and the setup overlap it;
the kernel waits for that grid (griddepcontrol.wait) before it reads a or a_scale.

Schedule: a persistent grid walks one global list of output tiles. Tiles are
numbered group by group, and within a group with the row block changing fastest,
so CTAs running at the same time share the group's weight tiles in L2. The rows
after the last group form one more "tail" group whose tiles are written as zeros.
Groups are read GROUP_CHUNK offsets at a time: one vector load, a running max
(the clamp above) and a prefix sum of tile counts give each group's rows and first
tile without a scalar load per group.

USE_TMA loads A and B tiles through device-side tensor descriptors (TMA on
sm_90+, zero-filled past K and N); otherwise through masked pointer loads
(cp.async on sm_80+). The launcher (runtime/kernels) passes the two hidden
scratch pointers and sizes the grid; it is the only caller at run time.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from et_trt_backend.kernels.int4_tiles import group_scales, int4_chunk_dot, load_a_chunk, packed_row_bytes


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def grouped_mm_kernel(
    a_ptr,
    b_ptr,
    offs_ptr,
    out_ptr,
    rows,
    K,
    N,
    G,
    a_scale_ptr,
    b_scale_ptr,
    FP8: tl.constexpr,
    WAIT_PRIOR_GRID: tl.constexpr,
    TRANS_B: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_CHUNK: tl.constexpr,
    group_size=0,
    INT4: tl.constexpr = False,
):
    dtype = out_ptr.dtype.element_ty
    program = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_n_tiles = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)

    if USE_TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[rows, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        if TRANS_B:
            b_desc = tl.make_tensor_descriptor(
                b_ptr, shape=[G, N, K], strides=[N * K, K, 1], block_shape=[1, BLOCK_N, BLOCK_K]
            )
        else:
            b_desc = tl.make_tensor_descriptor(
                b_ptr, shape=[G, K, N], strides=[K * N, N, 1], block_shape=[1, BLOCK_K, BLOCK_N]
            )

    if WAIT_PRIOR_GRID:
        gdc_wait()
    lane = tl.arange(0, GROUP_CHUNK)
    tile = program  # global number of the next tile this program computes
    chunk_start = 0  # first row of the chunk's first group
    chunk_first_tile = 0  # global number of the chunk's first tile
    # Groups 0..G-1 plus the tail group G, which ends at `rows`.
    for chunk in range(0, tl.cdiv(G + 1, GROUP_CHUNK)):
        g_idx = chunk * GROUP_CHUNK + lane
        raw_end = tl.load(offs_ptr + g_idx, mask=g_idx < G, other=rows)
        # end_g = min(rows, max(chunk_start, offs[chunk first..g])): the clamp, unrolled.
        ends = tl.minimum(tl.maximum(tl.associative_scan(raw_end, 0, _max), chunk_start), rows)
        prev = tl.load(offs_ptr + g_idx - 1, mask=(lane > 0) & (g_idx <= G), other=chunk_start)
        prev = tl.where(g_idx > G, rows, prev)  # lanes past the tail group are empty
        starts = tl.minimum(tl.maximum(tl.associative_scan(prev, 0, _max), chunk_start), rows)
        group_tiles = tl.cdiv(ends - starts, BLOCK_M) * num_n_tiles
        tiles_through = tl.cumsum(group_tiles, 0)  # inclusive prefix, chunk-relative
        chunk_tiles = tl.sum(group_tiles, 0)

        while tile < chunk_first_tile + chunk_tiles:
            local = tile - chunk_first_tile
            # The group holding this tile, and its bounds.
            in_group = lane == tl.sum((tiles_through <= local).to(tl.int32), 0)
            start = tl.sum(tl.where(in_group, starts, 0), 0)
            end = tl.sum(tl.where(in_group, ends, 0), 0)
            group_first_tile = tl.sum(tl.where(in_group, tiles_through - group_tiles, 0), 0)
            g = tl.sum(tl.where(in_group, g_idx, 0), 0)
            num_m_tiles = tl.cdiv(end - start, BLOCK_M)
            tile_in_group = local - group_first_tile
            off_m = start + (tile_in_group % num_m_tiles) * BLOCK_M
            off_n = (tile_in_group // num_m_tiles) * BLOCK_N
            rm = off_m + tl.arange(0, BLOCK_M)
            rn = off_n + tl.arange(0, BLOCK_N)

            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            k_end = tl.where(g < G, k_tiles, 0)  # the tail group only writes zeros
            if INT4:
                j = tl.arange(0, 16)
                row_ok = rm < end
                col_ok = rn < N
                a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * K + j[None, :]
                weight_rows = g.to(tl.int64) * N + rn
                w_ptrs = b_ptr + weight_rows[None, :] * packed_row_bytes(K) + j[:, None]
                for kt in range(0, k_end):
                    a_low, a_high = load_a_chunk(a_ptrs, row_ok, kt * BLOCK_K, K)
                    product = int4_chunk_dot(a_low, a_high, w_ptrs + kt * 16, col_ok)
                    acc += product * group_scales(b_scale_ptr, weight_rows, col_ok, kt * BLOCK_K, K,
                                                  group_size)[None, :]
            elif USE_TMA:
                for kt in range(0, k_end):
                    k = kt * BLOCK_K
                    a = a_desc.load([off_m, k])
                    if TRANS_B:
                        b = b_desc.load([g, off_n, k]).reshape(BLOCK_N, BLOCK_K).T
                    else:
                        b = b_desc.load([g, k, off_n]).reshape(BLOCK_K, BLOCK_N)
                    acc = tl.dot(a, b, acc)
            else:
                rk = tl.arange(0, BLOCK_K)
                row_ok = rm < end
                col_ok = rn < N
                # Out-of-range rows and columns are masked, never dereferenced.
                a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]
                b_base = b_ptr + g.to(tl.int64) * K * N
                if TRANS_B:
                    b_ptrs = b_base + rn.to(tl.int64)[None, :] * K + rk[:, None]
                else:
                    b_ptrs = b_base + rk.to(tl.int64)[:, None] * N + rn[None, :]
                for kt in range(0, k_end):
                    k_ok = kt * BLOCK_K + rk < K
                    a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                    acc = tl.dot(a, b, acc)
                    a_ptrs += BLOCK_K
                    if TRANS_B:
                        b_ptrs += BLOCK_K
                    else:
                        b_ptrs += BLOCK_K * N

            if FP8:
                a_scale = tl.load(a_scale_ptr + rm, mask=rm < end, other=0.0)
                # The tail group (g == G) has no weights and no scales: its products are zeros.
                scaled_columns = tl.where(g < G, N, 0)
                b_scale = tl.load(b_scale_ptr + g.to(tl.int64) * N + rn, mask=rn < scaled_columns, other=0.0)
                acc = acc * a_scale[:, None] * b_scale[None, :]
            out_ptrs = out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
            tl.store(out_ptrs, acc.to(dtype), mask=(rm < end)[:, None] & (rn < N)[None, :])
            tile += num_programs

        chunk_first_tile += chunk_tiles
        chunk_start = tl.max(ends, 0)
