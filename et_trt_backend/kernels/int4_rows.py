"""Triton source of the INT4 experts' per-expert kernels: the MoE op's gate+up and down with each weight tile read
once for all of its expert's pairs (et_trt_backend/int4_weights.py's packed layout and semantics).

They take int4_kernels.py's vector-matrix kernels' launch and arguments (grid (pairs, column blocks), no route, the
same combine after them), so the launcher can run either under the same kernel names. Not shipped: on an H100
(benchmarks/results/h100_int4/sweep2/) they beat the tiles only at a few cells, by 2-13%; benchmarks/
int4_gemv_sweep.py times them (prepare.py's ROWS_SWEEP). Program (p, block) serves expert
e = topk_ids[p] when p is e's first pair and returns at once otherwise; it finds e's pairs BLOCK_M at a time among
WINDOW pairs and multiplies their rows with its weight rows on the tensor cores, one K step of BLOCK_C 32-element
chunks (16-byte vector loads of each packed row) per iteration. The vector-matrix kernels read an expert's weights
once per pair (from L2 after the first) and unpack them once per pair; these read and unpack them once per
BLOCK_M pairs.
"""

import triton
import triton.language as tl

from et_trt_backend.kernels.int4_tiles import CHUNK_BYTES, nibble_values, packed_row_bytes
from et_trt_backend.kernels.moe_experts import _activate, _layout_rows


@triton.jit
def _first_pair_of_expert(ids_ptr, p, e, WINDOW: tl.constexpr):
    """Whether no pair before p is routed to expert e (program p then serves all of e's pairs)."""
    lane = tl.arange(0, WINDOW)
    earlier = 0
    for first in range(0, p, WINDOW):
        q = first + lane
        earlier += tl.sum((tl.load(ids_ptr + q, mask=q < p, other=-1) == e).to(tl.int32), 0)
    return earlier == 0


@triton.jit
def _next_rows_of_expert(ids_ptr, e, start, pairs, BLOCK_M: tl.constexpr, WINDOW: tl.constexpr):
    """The next (up to) BLOCK_M pairs of expert e among pairs [start, start + WINDOW), in order: (their indices
    [BLOCK_M], which are present, where the next search starts)."""
    q = start + tl.arange(0, WINDOW)
    match = tl.load(ids_ptr + q, mask=q < pairs, other=-1) == e
    rank = tl.cumsum(match.to(tl.int32), 0) - 1
    hit = match[None, :] & (rank[None, :] == tl.arange(0, BLOCK_M)[:, None])  # [BLOCK_M, WINDOW]
    pair = tl.sum(tl.where(hit, q[None, :], 0), 1)
    present = tl.sum(hit.to(tl.int32), 1) > 0
    # A window with more than BLOCK_M of e's pairs is searched again after the last one taken.
    more = tl.sum(match.to(tl.int32), 0) > BLOCK_M
    return pair, present, tl.where(more, tl.max(tl.where(present, pair, 0), 0) + 1, start + WINDOW)


@triton.jit
def _tile_times_rows(x_rows, row_ok, w_ptr, scale_ptr, rows, rows_ok, K, group_size, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """float32 [BLOCK_M, BLOCK_N]: activation rows (x_rows: pointers to each row's first element, zero where not
    row_ok) times INT4 weight rows `rows` (zero where not rows_ok), BLOCK_C chunks of K per step.

    Each step's weights are dequantized in registers to q * scale in float32, which is exact in TF32 (4 bits of q
    times the 8 of a bf16 scale fit TF32's 11), and multiplied on the tensor cores as one TF32 dot: the reference's
    products, summed in float32, whatever the group size. The unpacked values lie in (chunk, byte, low/high) order;
    the activations are loaded in that same order (element 32c + 16h + j at column 32c + 2j + h), so no weight value
    moves between threads before the dot."""
    row_bytes = packed_row_bytes(K)
    chunks = row_bytes // CHUNK_BYTES
    groups = (K + group_size - 1) // group_size
    c = tl.arange(0, BLOCK_C)
    j = tl.arange(0, 16)
    byte = c[:, None] * CHUNK_BYTES + j[None, :]  # [BLOCK_C, 16]
    w_base = w_ptr + rows[:, None, None] * row_bytes + byte[None, :, :]
    column = tl.reshape(c[:, None, None] * 32 + tl.arange(0, 2)[None, None, :] * 16 + j[None, :, None],
                        (BLOCK_C * 32,))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, chunks, BLOCK_C):
        chunk = first + c
        chunk_ok = chunk < chunks
        packed = tl.load(w_base + first * CHUNK_BYTES, mask=rows_ok[:, None, None] & chunk_ok[None, :, None],
                         other=0)
        scale = tl.load(scale_ptr + rows[:, None] * groups + (chunk * 32 // group_size)[None, :],
                        mask=rows_ok[:, None] & chunk_ok[None, :], other=0.0).to(tl.float32)[:, :, None]
        low, high = nibble_values(packed)
        w = tl.reshape(tl.join(low * scale, high * scale), (BLOCK_N, BLOCK_C * 32))
        k = first * 32 + column
        a = tl.load(x_rows[:, None] + k[None, :], mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
        acc = tl.dot(a.to(tl.float32), tl.trans(w), acc, input_precision="tf32")
    return acc


@triton.jit
def _gate_up_rows(x_ptr, pair, present, w_ptr, scale_ptr, bias_ptr, h_ptr, gate_rows, f, f_ok, H, F, top_k,
                  layout_block, group_size, activation, alpha, limit, has_bias, GATED: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """h[pair, f] for the pairs present (one expert's), gate and up rows in one loop when gated."""
    dtype = h_ptr.dtype.element_ty
    x_rows = x_ptr + (pair // top_k).to(tl.int64) * H
    if GATED:  # rows gate, up, gate, up...: the [BLOCK_M, BLOCK_N, 2] view splits into the two
        both_rows = tl.reshape(tl.join(gate_rows, gate_rows + layout_block), (2 * BLOCK_N,))
        both_ok = tl.reshape(tl.join(f_ok, f_ok), (2 * BLOCK_N,))
        both = _tile_times_rows(x_rows, present, w_ptr, scale_ptr, both_rows, both_ok, H, group_size, BLOCK_M,
                                2 * BLOCK_N, BLOCK_C)
        g, u = tl.split(tl.reshape(both, (BLOCK_M, BLOCK_N, 2)))
    else:
        g = _tile_times_rows(x_rows, present, w_ptr, scale_ptr, gate_rows, f_ok, H, group_size, BLOCK_M, BLOCK_N,
                             BLOCK_C)
        u = g
    if has_bias:
        g += tl.load(bias_ptr + gate_rows, mask=f_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            u += tl.load(bias_ptr + gate_rows + layout_block, mask=f_ok, other=0.0).to(tl.float32)[None, :]
    h = _activate(g.to(dtype).to(tl.float32), u.to(dtype).to(tl.float32), activation, alpha, limit, GATED)
    tl.store(h_ptr + pair.to(tl.int64)[:, None] * F + f[None, :], h.to(dtype), mask=present[:, None] & f_ok[None, :])


@triton.jit
def _down_rows(h_ptr, pair, present, w_ptr, scale_ptr, bias_ptr, weights_ptr, y_ptr, weight_rows, rn, n_ok, H, F,
               group_size, has_bias, weights_16bit, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """y[pair, rn] = topk_weights[pair] * (h[pair] @ w_down rows^T (+ bias)) in float32, for the pairs present (one
    expert's)."""
    acc = _tile_times_rows(h_ptr + pair.to(tl.int64) * F, present, w_ptr, scale_ptr, weight_rows, n_ok, F, group_size,
                           BLOCK_M, BLOCK_N, BLOCK_C)
    if has_bias:
        acc += tl.load(bias_ptr + weight_rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if weights_16bit:
        weight = tl.load(weights_ptr.to(tl.pointer_type(h_ptr.dtype.element_ty), bitcast=True) + pair, mask=present,
                         other=0.0).to(tl.float32)
    else:
        weight = tl.load(weights_ptr + pair, mask=present, other=0.0)
    tl.store(y_ptr + pair.to(tl.int64)[:, None] * H + rn[None, :], acc * weight[:, None],
             mask=present[:, None] & n_ok[None, :])


@triton.jit
def moe_int4_rows_gate_up_kernel(x_ptr, ids_ptr, w_ptr, scale_ptr, bias_ptr, h_ptr, pairs, E, H, F, top_k,
                                 layout_block, group_size, activation, alpha, limit, has_bias, GATED: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr,
                                 WINDOW: tl.constexpr):
    """moe_int4_gemv_gate_up_kernel's launch and result, each weight tile read once for all of its expert's pairs:
    program (p, f-block) serves expert e = topk_ids[p] if p is e's first pair (the others return at once), BLOCK_M
    of e's pairs at a time (tensor cores, _tile_times_rows)."""
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if (e >= 0) & (e < E) & _first_pair_of_expert(ids_ptr, p, e, WINDOW):
        f = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_per_expert, gate_row = _layout_rows(f, F, layout_block, GATED)
        start = p
        while start < pairs:
            pair, present, start = _next_rows_of_expert(ids_ptr, e, start, pairs, BLOCK_M, WINDOW)
            if tl.max(present.to(tl.int32), 0) > 0:  # a window without e's pairs costs only its search
                _gate_up_rows(x_ptr, pair, present, w_ptr, scale_ptr, bias_ptr, h_ptr,
                              e.to(tl.int64) * rows_per_expert + gate_row, f, f < F, H, F, top_k, layout_block,
                              group_size, activation, alpha, limit, has_bias, GATED, BLOCK_M, BLOCK_N, BLOCK_C)


@triton.jit
def moe_int4_rows_down_kernel(h_ptr, ids_ptr, w_ptr, scale_ptr, bias_ptr, weights_ptr, y_ptr, pairs, E, H, F,
                              group_size, has_bias, weights_16bit, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                              BLOCK_M: tl.constexpr, WINDOW: tl.constexpr):
    """moe_int4_gemv_down_kernel's launch and result, each weight tile read once for all of its expert's pairs (as
    moe_int4_rows_gate_up_kernel)."""
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p)
    if (e >= 0) & (e < E) & _first_pair_of_expert(ids_ptr, p, e, WINDOW):
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        start = p
        while start < pairs:
            pair, present, start = _next_rows_of_expert(ids_ptr, e, start, pairs, BLOCK_M, WINDOW)
            if tl.max(present.to(tl.int32), 0) > 0:
                _down_rows(h_ptr, pair, present, w_ptr, scale_ptr, bias_ptr, weights_ptr, y_ptr,
                           e.to(tl.int64) * H + rn, rn, rn < H, H, F, group_size, has_bias, weights_16bit, BLOCK_M,
                           BLOCK_N, BLOCK_C)
