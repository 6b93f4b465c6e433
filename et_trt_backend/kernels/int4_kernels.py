"""Triton source of the INT4 expert weights' kernels (weights in et_trt_backend/int4_weights.py's packed layout).

Two paths, which the launchers choose between by the rows each expert's weights serve:

- memory-bound, for the smallest token counts: a vector-matrix kernel per routed row. Each program takes one
  row of activations (one (token, expert) pair of the MoE op, one row of a GroupedMM) and BLOCK_N weight rows,
  and streams the whole K of those rows once: BLOCK_C 16-byte chunks per step, 8 bytes of one row per thread (one
  vector load), each chunk's 32 products summed and scaled by its group's scale in float32.
  Programs of consecutive rows take the same weight rows (the row is the grid's fastest index), so the rows of
  one expert read its weights from L2 at about the same time and DRAM sees each touched weight byte about once.
  grouped_mm_int4_gemv_kernel (GroupedMM), moe_int4_gemv_gate_up_kernel (the MoE op's gate+up and activation,
  rows by pair, no sort) and moe_int4_gemv_down_kernel (down, routing weight and bias, float32 rows by pair,
  summed by moe_experts.moe_combine_kernel), or moe_int4_gemv_down_combine_kernel (both in one launch, by token).
- tensor cores, above: the grouped GEMM kernels (grouped_mm.py, moe_experts.py) with INT4 = True load a chunk of
  32 elements of BLOCK_N weight rows per step (16 bytes a row), unpack it in registers and multiply it
  (int4_tiles.py). The MoE op has a third path between the two: moe_int4_mma.cu (CUDA, int4_mma.py), in these
  kernels' launch, each expert's weights read once for its pairs on mma.sync.

Semantics as int4_weights.py: the products of the activations with q * scale accumulate in float32; a GroupedMM's
output is rounded to the activations' dtype, the MoE op's intermediate roundings are moe_experts.py's.
"""

import triton
import triton.language as tl

from et_trt_backend.kernels.int4_tiles import CHUNK_BYTES, nibble_values, packed_row_bytes
from et_trt_backend.kernels.moe_experts import _activate, _layout_rows, wait_prior_grid


@triton.jit
def _rows_times_vector(x_ptr, w_ptr, scale_ptr, rows, row_ok, K, group_size, BLOCK_N: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    """float32 [BLOCK_N]: the activations x [K] (any float dtype) times INT4 weight rows `rows` (int64 [BLOCK_N],
    indices into w_ptr's packed rows and scale_ptr's scale rows); zero on rows not row_ok.

    A step reads BLOCK_C chunks of each row as [rows, chunk, half, 8 bytes]; the activations are loaded in that same
    shape (each thread the 8 + 8 activations its 8 bytes multiply), so the two loads share one register layout and
    nothing moves between threads before the sums: 8 bytes (16 weights) against two 16-byte activation loads."""
    row_bytes = packed_row_bytes(K)
    chunks = row_bytes // CHUNK_BYTES
    groups = (K + group_size - 1) // group_size
    c = tl.arange(0, BLOCK_C)
    half = tl.arange(0, 2)
    j = tl.arange(0, 8)
    byte = c[:, None, None] * CHUNK_BYTES + half[None, :, None] * 8 + j[None, None, :]  # [BLOCK_C, 2, 8]
    low_k = c[:, None, None] * 32 + half[None, :, None] * 8 + j[None, None, :]  # element of each byte's low nibble
    w_base = w_ptr + rows[:, None, None, None] * row_bytes + byte[None, :, :, :]
    s_base = scale_ptr + rows[:, None] * groups
    shape: tl.constexpr = (BLOCK_N, BLOCK_C, 2, 8)
    acc = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
    for first in range(0, chunks, BLOCK_C):
        chunk = first + c
        chunk_ok = chunk < chunks
        packed = tl.load(w_base + first * CHUNK_BYTES,
                         mask=row_ok[:, None, None, None] & chunk_ok[None, :, None, None], other=0)
        low, high = nibble_values(packed)
        k = tl.broadcast_to(first * 32 + low_k[None, :, :, :], shape)
        x_low = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        x_high = tl.load(x_ptr + k + 16, mask=k + 16 < K, other=0.0).to(tl.float32)
        part = tl.sum(tl.sum(low * x_low + high * x_high, axis=3), axis=2)
        scale = tl.load(s_base + (chunk * 32 // group_size)[None, :], mask=row_ok[:, None] & chunk_ok[None, :],
                        other=0.0)
        acc += part * scale.to(tl.float32)
    return tl.sum(acc, axis=1)


@triton.jit
def _group_of_row(offs_ptr, r, rows, G, GROUP_CHUNK: tl.constexpr):
    """GroupedMM's group of row r (end_g = clamp(offs[g], start_g, rows), ends a running max): the first g with
    end_g > r, G where none is (r lies past the last group)."""
    lane = tl.arange(0, GROUP_CHUNK)
    count = 0  # groups ending at or before r
    running = 0  # end of the last group read
    for first in range(0, G, GROUP_CHUNK):
        g = first + lane
        raw = tl.load(offs_ptr + g, mask=g < G, other=rows)
        ends = tl.minimum(tl.maximum(tl.associative_scan(raw, 0, _max), running), rows)
        count += tl.sum((ends <= r).to(tl.int32), 0)
        running = tl.max(ends, 0)
    return count


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def grouped_mm_int4_gemv_kernel(a_ptr, b_ptr, offs_ptr, out_ptr, rows, K, N, G, b_scale_ptr, group_size,
                                BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, GROUP_CHUNK: tl.constexpr):
    """out[r, n-block] = a[r] @ B_g[n-block]^T for program (r, n-block) = (pid % rows, pid // rows); rows past the
    last group are zero. b [G, N, K] INT4 (packed), b_scale bf16 [G, N, ceil(K / group_size)]."""
    pid = tl.program_id(0)
    r = pid % rows
    rn = (pid // rows) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    g = _group_of_row(offs_ptr, r, rows, G, GROUP_CHUNK)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)  # rows past the last group stay zero
    if g < G:
        acc = _rows_times_vector(a_ptr + r.to(tl.int64) * K, b_ptr, b_scale_ptr, g.to(tl.int64) * N + rn, n_ok, K,
                                 group_size, BLOCK_N, BLOCK_C)
    tl.store(out_ptr + r.to(tl.int64) * N + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def moe_int4_gemv_gate_up_kernel(x_ptr, ids_ptr, w_ptr, scale_ptr, bias_ptr, h_ptr, pairs, E, H, F, top_k,
                                 layout_block, group_size, activation, alpha, limit, has_bias, GATED: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, PAIRED: tl.constexpr = False,
                                 WAIT_PRIOR_GRID: tl.constexpr = False):
    """h[p, f-block] = act(hidden[p // k] @ w_gate_up[e]^T (+ bias)) for program (p, f-block), e = topk_ids[p];
    nothing for pairs whose id is outside [0, E). Roundings as moe_experts.moe_gate_up_kernel's.
    PAIRED (gated): the gate and up rows of a feature stream in one loop (2 x BLOCK_N rows a step, twice the bytes
    in flight) rather than in two loops one after the other."""
    wait_prior_grid(WAIT_PRIOR_GRID)
    dtype = h_ptr.dtype.element_ty
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if (e >= 0) & (e < E):
        f = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        f_ok = f < F
        rows_per_expert, gate_row = _layout_rows(f, F, layout_block, GATED)
        first_row = e.to(tl.int64) * rows_per_expert
        x_row = x_ptr + (p // top_k).to(tl.int64) * H
        if GATED and PAIRED:
            # Rows interleaved gate, up, gate, up...: the sums' [BLOCK_N, 2] view splits into the two.
            i = tl.arange(0, 2 * BLOCK_N)
            fi = tl.program_id(1) * BLOCK_N + i // 2
            rows = first_row + fi // layout_block * 2 * layout_block + fi % layout_block + i % 2 * layout_block
            both = _rows_times_vector(x_row, w_ptr, scale_ptr, rows, fi < F, H, group_size, 2 * BLOCK_N, BLOCK_C)
            g, u = tl.split(tl.reshape(both, (BLOCK_N, 2)))
        else:
            g = _rows_times_vector(x_row, w_ptr, scale_ptr, first_row + gate_row, f_ok, H, group_size, BLOCK_N,
                                   BLOCK_C)
            u = g
            if GATED:
                u = _rows_times_vector(x_row, w_ptr, scale_ptr, first_row + gate_row + layout_block, f_ok, H,
                                       group_size, BLOCK_N, BLOCK_C)
        if has_bias:
            g += tl.load(bias_ptr + first_row + gate_row, mask=f_ok, other=0.0).to(tl.float32)
            if GATED:
                u += tl.load(bias_ptr + first_row + gate_row + layout_block, mask=f_ok, other=0.0).to(tl.float32)
        h = _activate(g.to(dtype).to(tl.float32), u.to(dtype).to(tl.float32), activation, alpha, limit, GATED)
        tl.store(h_ptr + p.to(tl.int64) * F + f, h.to(dtype), mask=f_ok)


@triton.jit
def _weighted_down_row(h_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, p, e, rn, n_ok, H, F, group_size, has_bias,
                       weights_16bit, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """float32 [BLOCK_N]: topk_weights[p] * (h[p] @ w_down[e][rn]^T (+ bias)), pair p's down rows rn."""
    weight_rows = e.to(tl.int64) * H + rn
    acc = _rows_times_vector(h_ptr + p.to(tl.int64) * F, w_ptr, scale_ptr, weight_rows, n_ok, F, group_size,
                             BLOCK_N, BLOCK_C)
    if has_bias:
        acc += tl.load(bias_ptr + weight_rows, mask=n_ok, other=0.0).to(tl.float32)
    if weights_16bit:
        weight = tl.load(weights_ptr.to(tl.pointer_type(h_ptr.dtype.element_ty), bitcast=True) + p).to(tl.float32)
    else:
        weight = tl.load(weights_ptr + p)
    return acc * weight


@triton.jit
def moe_int4_gemv_down_kernel(h_ptr, ids_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, y_ptr, pairs, E, H, F,
                              group_size, has_bias, weights_16bit, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                              WAIT_PRIOR_GRID: tl.constexpr = False):
    """y[p, n-block] = topk_weights[p] * (h[p] @ w_down[e]^T (+ bias)) in float32 for program (p, n-block),
    e = topk_ids[p]; nothing for pairs whose id is outside [0, E) (the combine skips them)."""
    wait_prior_grid(WAIT_PRIOR_GRID)
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if (e >= 0) & (e < E):
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        y = _weighted_down_row(h_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, p, e, rn, n_ok, H, F, group_size,
                               has_bias, weights_16bit, BLOCK_N, BLOCK_C)
        tl.store(y_ptr + p.to(tl.int64) * H + rn, y, mask=n_ok)


@triton.jit
def moe_int4_gemv_down_combine_kernel(h_ptr, ids_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, out_ptr, T, E, H, F,
                                      top_k, group_size, has_bias, weights_16bit, BLOCK_N: tl.constexpr,
                                      BLOCK_C: tl.constexpr, WAIT_PRIOR_GRID: tl.constexpr = False):
    """out[t, n-block] = the sum over j of topk_weights[t, j] * (h[t * k + j] @ w_down[e]^T (+ bias)) for program
    (t, n-block), e = topk_ids[t, j], pairs whose id is outside [0, E) skipped: moe_int4_gemv_down_kernel and
    moe_experts.moe_combine_kernel in one launch (the same float32 sums in order of j, one rounding), one launch
    less where launches are most of the time (a token or a few)."""
    wait_prior_grid(WAIT_PRIOR_GRID)
    t = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < H
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(0, top_k):
        p = t * top_k + j
        e = tl.load(ids_ptr + p)
        if (e >= 0) & (e < E):
            out += _weighted_down_row(h_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, p, e, rn, n_ok, H, F,
                                      group_size, has_bias, weights_16bit, BLOCK_N, BLOCK_C)
    tl.store(out_ptr + t.to(tl.int64) * H + rn, out.to(out_ptr.dtype.element_ty), mask=n_ok)
