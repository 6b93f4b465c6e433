"""Triton source of the fused MoE experts kernels (the MoEExperts op; semantics in et_trt_backend/moe_experts.py).

Four launches, in order, on one stream; nothing goes back to the host:

  moe_route_kernel    topk_ids [T, k] -> offs [E] (inclusive ends of each expert's rows), the token-expert pairs
                      p = t * k + j sorted by expert (stable; ids outside [0, E) dropped) and the table of m-tiles
                      (expert, first row) the two GEMMs walk
  moe_gate_up_kernel  h[r] = act(hidden[pairs[r] // k] @ w_gate_up[e]^T (+ bias)) for the rows r of each tile: the
                      rows are gathered from hidden by pointer (no permuted copy); gated activations keep a gate and
                      an up accumulator over the same features, so the activation is in the epilogue
  moe_down_kernel     y[pairs[r]] = topk_weights[pairs[r]] * (h[r] @ w_down[e]^T (+ bias)), float32, each row
                      written where its pair (t, j) lies
  moe_combine_kernel  out[t] = sum over j of y[t * k + j] where topk_ids[t, j] is in [0, E), rounded

moe_route_kernel runs cdiv(T * k, CHUNK) programs. Each reads every id once (the histograms of all chunks,
and of those before its own), so every program knows each expert's first row and the pairs of the same expert in
the chunks before its own; it sorts its own chunk by (expert, index) and writes each pair at that expert's first
row + the earlier chunks' pairs + its rank in the chunk: the order is the stable sort's whatever the grid, and no
atomics are needed. Program 0 also writes offs and the tile table: tiles[0] the number of m-tiles, then
(expert, first row) per tile, tiles of BLOCK_M = block_m rows (runtime: the GEMMs' variant decides), experts in
order. E <= E_PAD (a variant per bound).

The GEMMs run a grid of (m-tile bound, column blocks): program (m, n) computes m-tile m's rows for columns
[n * BLOCK_N, ...) and does nothing past the table's count. Weights are [E, out, in] (the trans_b form) and are
read by pointer, so any gate+up row layout is one runtime block size B (gate row (f // B) * 2B + f % B, up row
that + B; moe_experts.layout_block). The activation is a runtime enum (plugin_names.MOE_ACTIVATIONS): one image
serves every activation of its GATED form. Products accumulate in float32 (tl.dot); the gate+up output is rounded
to the activations' dtype before the activation and the activation's result after it, as the contract says.

INT4 = True builds the two GEMMs for INT4 expert weights (et_trt_backend/int4_weights.py: packed rows, bf16 group
scales at scale_ptr, group_size; BLOCK_K 32, int4_tiles.py); dense builds take scale_ptr and group_size as
constexprs, not parameters. For few pairs per expert the launcher runs int4_kernels.py's vector-matrix kernels
instead (no route).

The launcher (runtime/kernels/moe_experts_launcher.cc) sizes the grids and the workspace. On sm_90a, where its
dispatch rule says (MoEExpertsLauncher::rule_path: large hidden and FFN sizes, enough rows per expert), it runs the hand-written wgmma kernel's MoE builds (grouped_mm_sm90.cu) instead of the
two GEMMs here, behind moe_gather_kernel, which copies the rows in pair order for its TMA loads: five launches.

WAIT_PRIOR_GRID (every kernel here and int4_kernels.py's vector-matrix kernels, built so for sm_90+): the kernel
waits for the grid before it in the stream (wait_prior_grid) before it reads anything, so the launcher may start it
while that grid runs (programmatic dependent launch): its launch overlaps the kernel before.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from et_trt_backend.kernels.int4_tiles import group_scales, int4_chunk_dot, load_a_chunk, packed_row_bytes

@triton.jit
def _chunk_histogram(ids_ptr, pair, pairs, E, E_PAD: tl.constexpr):
    """Pairs per expert among `pair` (pairs past `pairs` and ids outside [0, E) counted nowhere)."""
    ids = tl.load(ids_ptr + pair, mask=pair < pairs, other=-1)
    valid = (ids >= 0) & (ids < E)
    counts = tl.histogram(tl.where(valid, ids, 0), E_PAD)
    # Invalid ids were counted in bin 0: take them out again.
    return counts - tl.where(tl.arange(0, E_PAD) == 0, tl.sum((~valid).to(tl.int32), 0), 0), ids, valid


@triton.jit
def _write_tiles(tiles_ptr, counts, ends, block_m, CHUNK: tl.constexpr, E_PAD: tl.constexpr):
    """The m-tile table: tiles_ptr[0] = number of tiles; tile i at [1 + 2i] (expert) and [2 + 2i] (first row)."""
    tiles = (counts + block_m - 1) // block_m
    tiles_through = tl.cumsum(tiles, 0)
    first_tile = tiles_through - tiles
    starts = ends - counts
    total = tl.sum(tiles, 0)
    tl.store(tiles_ptr, total)
    for base in range(0, total, CHUNK):
        tile = base + tl.arange(0, CHUNK)
        # The expert of each tile: the first e with tiles_through[e] > tile, by binary search (E_PAD <= 2^10).
        lo = tl.zeros([CHUNK], tl.int32)
        hi = tl.full([CHUNK], E_PAD, tl.int32)
        for _ in tl.static_range(11):
            searching = lo < hi
            mid = tl.minimum((lo + hi) // 2, E_PAD - 1)
            right = tl.gather(tiles_through, mid, 0) <= tile
            lo = tl.where(searching & right, mid + 1, lo)
            hi = tl.where(searching & ~right, mid, hi)
        expert = tl.minimum(lo, E_PAD - 1)
        row = tl.gather(starts, expert, 0) + (tile - tl.gather(first_tile, expert, 0)) * block_m
        ok = tile < total
        tl.store(tiles_ptr + 1 + 2 * tile, expert, mask=ok)
        tl.store(tiles_ptr + 2 + 2 * tile, row, mask=ok)


@triton.jit
def moe_route_kernel(ids_ptr, offs_ptr, sorted_ptr, tiles_ptr, pairs, E, block_m, CHUNK: tl.constexpr,
                     E_PAD: tl.constexpr, WAIT_PRIOR_GRID: tl.constexpr = False):
    wait_prior_grid(WAIT_PRIOR_GRID)
    program = tl.program_id(0)
    lane = tl.arange(0, CHUNK)
    total = tl.zeros([E_PAD], tl.int32)
    before = tl.zeros([E_PAD], tl.int32)  # this expert's pairs in the chunks before this program's
    for chunk in range(0, tl.cdiv(pairs, CHUNK)):
        counts, _, _ = _chunk_histogram(ids_ptr, chunk * CHUNK + lane, pairs, E, E_PAD)
        total += counts
        before += counts * (chunk < program).to(tl.int32)
    ends = tl.cumsum(total, 0)
    if program == 0:
        tl.store(offs_ptr + tl.arange(0, E_PAD), ends, mask=tl.arange(0, E_PAD) < E)
        _write_tiles(tiles_ptr, total, ends, block_m, CHUNK, E_PAD)
    pair = program * CHUNK + lane
    counts, ids, valid = _chunk_histogram(ids_ptr, pair, pairs, E, E_PAD)
    # Sorted by (expert, index); invalid pairs (key E_PAD) last.
    ordered = tl.sort(tl.where(valid, ids, E_PAD) * CHUNK + lane, 0)
    expert = ordered // CHUNK
    # A pair's place: its expert's first row, plus the expert's pairs in earlier chunks, plus its rank here
    # (its position in the sorted chunk less the expert's first position in it).
    base = (ends - total) + before - (tl.cumsum(counts, 0) - counts)
    place = tl.gather(base, tl.minimum(expert, E_PAD - 1), 0) + lane
    tl.store(sorted_ptr + place, program * CHUNK + ordered % CHUNK, mask=expert < E)


@triton.jit
def _m_tile(tiles_ptr, offs_ptr, BLOCK_M: tl.constexpr):
    """(expert, first row, end row) of this program's m-tile; end <= first past the table."""
    tile = tl.program_id(0)
    present = tile < tl.load(tiles_ptr)
    expert = tl.load(tiles_ptr + 1 + 2 * tile, mask=present, other=0)
    first = tl.load(tiles_ptr + 2 + 2 * tile, mask=present, other=0)
    end = tl.minimum(tl.load(offs_ptr + expert), first + BLOCK_M)
    return expert, first, tl.where(present, end, first)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _gelu(x, tanh_form):
    if tanh_form:  # tanh(z) = 2 sigmoid(2z) - 1
        y = x * _sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))  # 2 sqrt(2 / pi)
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))  # 1 / sqrt(2)
    return y


@triton.jit
def wait_prior_grid(WAIT_PRIOR_GRID: tl.constexpr):
    """Waits for the grid before this one in the stream (its writes visible), then lets the next one launch; nothing
    where the build does not ask for it (WAIT_PRIOR_GRID False: before sm_90, and in the eager paths)."""
    if WAIT_PRIOR_GRID:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _activate(g, u, activation, alpha, limit, GATED: tl.constexpr):
    """The activation (plugin_names.MOE_ACTIVATIONS) in float32; u is unused unless GATED."""
    if GATED:
        if activation == 0:  # swiglu
            h = g * _sigmoid(g) * u
        elif activation == 3:  # gptoss_glu
            g_clamped = tl.minimum(g, limit)
            u_clamped = tl.minimum(tl.maximum(u, -limit), limit)
            h = (u_clamped + 1.0) * g_clamped * _sigmoid(alpha * g_clamped)
        else:  # geglu_tanh (1), geglu_erf (2)
            h = _gelu(g, activation == 1) * u
    else:
        if activation == 4:  # silu
            h = g * _sigmoid(g)
        elif activation == 7:  # relu2
            h = tl.maximum(g, 0.0) * tl.maximum(g, 0.0)
        else:  # gelu_tanh (5), gelu_erf (6)
            h = _gelu(g, activation == 5)
    return h


@triton.jit
def _gate_up_tile(sorted_ptr, first, end, F, top_k, layout_block, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """An m-tile's rows (their mask, their tokens) and this program's features (their mask, their gate rows among
    the expert's rows_per_expert gate+up rows)."""
    rm = first + tl.arange(0, BLOCK_M)
    row_ok = rm < end
    token = tl.load(sorted_ptr + rm, mask=row_ok, other=0) // top_k
    f = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_per_expert, gate_row = _layout_rows(f, F, layout_block, GATED)
    return rm, row_ok, token, f, f < F, rows_per_expert, gate_row


@triton.jit
def _layout_rows(f, F, layout_block, GATED: tl.constexpr):
    """(an expert's gate+up rows, the gate rows of features f): layout block B puts feature f's gate row at
    (f // B) * 2B + f % B and its up row B further."""
    if GATED:
        rows_per_expert = 2 * F
        gate_row = f // layout_block * 2 * layout_block + f % layout_block
    else:
        rows_per_expert = F
        gate_row = f
    return rows_per_expert, gate_row


@triton.jit
def _gate_up_products(x_ptr, token, row_ok, w_ptr, expert, rows_per_expert, gate_row, f_ok, layout_block, H,
                      GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 gate and up accumulators of rows x[token] against the expert's gate and up rows (weights of
    x's type: the part's dtype, or e4m3 with e4m3 rows)."""
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rk = tl.arange(0, BLOCK_K)
    # Rows gathered by token; rows past the tile's end are masked, never read.
    a_ptrs = x_ptr + token.to(tl.int64)[:, None] * H + rk[None, :]
    w_base = w_ptr + expert.to(tl.int64) * rows_per_expert * H
    g_ptrs = w_base + gate_row.to(tl.int64)[None, :] * H + rk[:, None]
    for k in range(0, tl.cdiv(H, BLOCK_K)):
        k_ok = k * BLOCK_K + rk < H
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & f_ok[None, :]
        acc_g = tl.dot(a, tl.load(g_ptrs, mask=w_mask, other=0.0), acc_g)
        if GATED:
            acc_u = tl.dot(a, tl.load(g_ptrs + layout_block * H, mask=w_mask, other=0.0), acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
    return acc_g, acc_u


@triton.jit
def _gate_up_activation(acc_g, acc_u, bias_ptr, has_bias, expert, rows_per_expert, gate_row, layout_block, f_ok,
                        activation, alpha, limit, GATED: tl.constexpr):
    """The activation (float32) of the gate+up accumulators: bias added, rounded to the part's dtype (bias_ptr's)
    before it, as the contract says; the caller rounds the result."""
    dtype = bias_ptr.dtype.element_ty
    if has_bias:
        b_base = bias_ptr + expert.to(tl.int64) * rows_per_expert
        acc_g += tl.load(b_base + gate_row, mask=f_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_u += tl.load(b_base + gate_row + layout_block, mask=f_ok, other=0.0).to(tl.float32)[None, :]
    return _activate(acc_g.to(dtype).to(tl.float32), acc_u.to(dtype).to(tl.float32), activation, alpha, limit, GATED)


@triton.jit
def _store_weighted_rows(y_ptr, acc, sorted_ptr, rm, row_ok, rn, n_ok, bias_ptr, has_bias, expert, H, weights_ptr,
                         weights_16bit):
    """The down GEMM's epilogue: y[pairs[r]] = topk_weights[pairs[r]] * (acc (+ bias)) in float32, each row where
    its pair (t, j) lies; topk_weights float32, or (weights_16bit) in the part's dtype (bias_ptr's)."""
    dtype = bias_ptr.dtype.element_ty
    if has_bias:
        acc += tl.load(bias_ptr + expert.to(tl.int64) * H + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    pair = tl.load(sorted_ptr + rm, mask=row_ok, other=0)
    if weights_16bit:
        weight = tl.load(weights_ptr.to(tl.pointer_type(dtype), bitcast=True) + pair, mask=row_ok,
                         other=0.0).to(tl.float32)
    else:
        weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)
    tl.store(y_ptr + pair.to(tl.int64)[:, None] * H + rn[None, :], acc * weight[:, None],
             mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_gate_up_kernel(x_ptr, sorted_ptr, w_ptr, bias_ptr, tiles_ptr, offs_ptr, h_ptr, H, F, top_k, layout_block,
                       activation, alpha, limit, has_bias, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, scale_ptr=None, group_size=0,
                       INT4: tl.constexpr = False, WAIT_PRIOR_GRID: tl.constexpr = False):
    wait_prior_grid(WAIT_PRIOR_GRID)
    dtype = h_ptr.dtype.element_ty
    expert, first, end = _m_tile(tiles_ptr, offs_ptr, BLOCK_M)
    if first < end:
        rm, row_ok, token, f, f_ok, rows_per_expert, gate_row = _gate_up_tile(sorted_ptr, first, end, F, top_k,
                                                                              layout_block, GATED, BLOCK_M, BLOCK_N)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if INT4:  # BLOCK_K 32: one packed chunk of the gate and up rows per step (int4_tiles.py)
            j = tl.arange(0, 16)
            gate_rows = expert.to(tl.int64) * rows_per_expert + gate_row
            up_rows = gate_rows + layout_block
            a_ptrs = x_ptr + token.to(tl.int64)[:, None] * H + j[None, :]
            g_ptrs = w_ptr + gate_rows[None, :] * packed_row_bytes(H) + j[:, None]
            u_ptrs = w_ptr + up_rows[None, :] * packed_row_bytes(H) + j[:, None]
            for k in range(0, tl.cdiv(H, BLOCK_K)):
                a_low, a_high = load_a_chunk(a_ptrs, row_ok, k * BLOCK_K, H)
                acc_g += int4_chunk_dot(a_low, a_high, g_ptrs + k * 16, f_ok) * group_scales(
                    scale_ptr, gate_rows, f_ok, k * BLOCK_K, H, group_size)[None, :]
                if GATED:
                    acc_u += int4_chunk_dot(a_low, a_high, u_ptrs + k * 16, f_ok) * group_scales(
                        scale_ptr, up_rows, f_ok, k * BLOCK_K, H, group_size)[None, :]
        else:
            acc_g, acc_u = _gate_up_products(x_ptr, token, row_ok, w_ptr, expert, rows_per_expert, gate_row, f_ok,
                                             layout_block, H, GATED, BLOCK_M, BLOCK_N, BLOCK_K)
        # The gate+up output in the part's dtype, the activation in float32, its result in the part's dtype.
        h = _gate_up_activation(acc_g, acc_u, bias_ptr, has_bias, expert, rows_per_expert, gate_row, layout_block,
                                f_ok, activation, alpha, limit, GATED)
        tl.store(h_ptr + rm.to(tl.int64)[:, None] * F + f[None, :], h.to(dtype), mask=row_ok[:, None] & f_ok[None, :])


@triton.jit
def moe_down_kernel(h_ptr, sorted_ptr, w_ptr, bias_ptr, weights_ptr, tiles_ptr, offs_ptr, y_ptr, H, F, has_bias,
                    weights_16bit, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    scale_ptr=None, group_size=0, INT4: tl.constexpr = False, WAIT_PRIOR_GRID: tl.constexpr = False):
    wait_prior_grid(WAIT_PRIOR_GRID)
    expert, first, end = _m_tile(tiles_ptr, offs_ptr, BLOCK_M)
    if first < end:
        rm = first + tl.arange(0, BLOCK_M)
        row_ok = rm < end
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if INT4:  # BLOCK_K 32: one packed chunk per step (int4_tiles.py)
            j = tl.arange(0, 16)
            weight_rows = expert.to(tl.int64) * H + rn
            a_ptrs = h_ptr + rm.to(tl.int64)[:, None] * F + j[None, :]
            w_ptrs = w_ptr + weight_rows[None, :] * packed_row_bytes(F) + j[:, None]
            for k in range(0, tl.cdiv(F, BLOCK_K)):
                a_low, a_high = load_a_chunk(a_ptrs, row_ok, k * BLOCK_K, F)
                acc += int4_chunk_dot(a_low, a_high, w_ptrs + k * 16, n_ok) * group_scales(
                    scale_ptr, weight_rows, n_ok, k * BLOCK_K, F, group_size)[None, :]
        else:
            rk = tl.arange(0, BLOCK_K)
            a_ptrs = h_ptr + rm.to(tl.int64)[:, None] * F + rk[None, :]
            w_base = w_ptr + expert.to(tl.int64) * H * F
            w_ptrs = w_base + rn.to(tl.int64)[None, :] * F + rk[:, None]
            for k in range(0, tl.cdiv(F, BLOCK_K)):
                k_ok = k * BLOCK_K + rk < F
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                acc = tl.dot(a, tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0), acc)
                a_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
        _store_weighted_rows(y_ptr, acc, sorted_ptr, rm, row_ok, rn, n_ok, bias_ptr, has_bias, expert, H, weights_ptr,
                             weights_16bit)


@triton.jit
def moe_combine_kernel(y_ptr, ids_ptr, out_ptr, T, H, top_k, E, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                       WAIT_PRIOR_GRID: tl.constexpr = False):
    wait_prior_grid(WAIT_PRIOR_GRID)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = rt < T
    h_ok = rh < H
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for j in range(0, top_k):  # in order of j, as the reference sums
        pair = rt.to(tl.int64) * top_k + j
        expert = tl.load(ids_ptr + pair, mask=t_ok, other=-1)
        used = t_ok & (expert >= 0) & (expert < E)  # dropped pairs' rows were never written
        acc += tl.load(y_ptr + pair[:, None] * H + rh[None, :], mask=used[:, None] & h_ok[None, :],
                       other=0.0).to(tl.float32)
    tl.store(out_ptr + rt.to(tl.int64)[:, None] * H + rh[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=t_ok[:, None] & h_ok[None, :])


@triton.jit
def moe_gather_kernel(x_ptr, sorted_ptr, offs_ptr, a_ptr, H, E, top_k, BLOCK_R: tl.constexpr,
                      BLOCK_H: tl.constexpr, WAIT_PRIOR_GRID: tl.constexpr = False):
    """a[r] = hidden[pairs[r] // k] for the valid pairs' rows r < offs[E - 1] (the wgmma path's A operand)."""
    wait_prior_grid(WAIT_PRIOR_GRID)
    rows = tl.load(offs_ptr + E - 1)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = r < rows
    token = tl.load(sorted_ptr + r, mask=row_ok, other=0) // top_k
    mask = row_ok[:, None] & (c < H)[None, :]
    values = tl.load(x_ptr + token.to(tl.int64)[:, None] * H + c[None, :], mask=mask)
    tl.store(a_ptr + r.to(tl.int64)[:, None] * H + c[None, :], values, mask=mask)
