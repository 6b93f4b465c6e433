"""Triton helpers shared by the INT4 kernels (int4_kernels.py) and the grouped GEMMs' INT4 builds (grouped_mm.py,
moe_experts.py): reading et_trt_backend/int4_weights.py's packed layout.

The tensor-core path loads a chunk of 32 elements of BLOCK_N weight rows per step (16 bytes a row), unpacks it in
registers into the two halves' integer values in the activations' dtype (exact) and multiplies them as two dots of
K = 16 with the two matching runs of 16 activation columns (int4_chunk_dot); the float32 product is scaled by the
chunk's group scale (group_scales) and accumulated. So BLOCK_K is 32 there: a chunk, which lies in one group for
every group size.

Nibbles become float32 values without a conversion instruction: a nibble v or'ed into the bits of 2^23 is the
float 2^23 + v, and subtracting 2^23 + 8 leaves v - 8 exactly (nibble_values).
"""

import triton
import triton.language as tl

CHUNK_BYTES = tl.constexpr(16)  # bytes of one 32-element chunk of a packed row
_TWO_23_BITS = tl.constexpr(0x4B000000)  # the float 2^23


@triton.jit
def nibble_values(packed):
    """(low, high) nibbles of packed bytes (uint8) as float32 values q = nibble - 8 in [-8, 7]."""
    b = packed.to(tl.int32)
    low = ((b & 0xF) | _TWO_23_BITS).to(tl.float32, bitcast=True) - 8388616.0
    high = ((b >> 4) | _TWO_23_BITS).to(tl.float32, bitcast=True) - 8388616.0
    return low, high


@triton.jit
def packed_row_bytes(K):
    """Bytes of one packed row of K elements (K rounded up to a 32-element chunk)."""
    return (K + 31) // 32 * CHUNK_BYTES


@triton.jit
def load_a_chunk(a_ptrs, row_ok, k, K):
    """The activations of chunk [k, k + 32) of rows a_ptrs (pointers to each row's first 16 columns, [BM, 16]): the
    low half's 16 columns and the high half's, zero past K and on rows not row_ok."""
    j = tl.arange(0, 16)
    low = tl.load(a_ptrs + k, mask=row_ok[:, None] & (k + j < K)[None, :], other=0.0)
    high = tl.load(a_ptrs + k + 16, mask=row_ok[:, None] & (k + 16 + j < K)[None, :], other=0.0)
    return low, high


@triton.jit
def int4_chunk_dot(a_low, a_high, w_ptrs, col_ok):
    """float32 [BM, BN]: one chunk's products of a_low / a_high ([BM, 16] each) with the INT4 weight rows whose chunk
    w_ptrs points to ([16, BN] byte pointers, byte j of each row along the first axis); rows not col_ok are zero."""
    packed = tl.load(w_ptrs, mask=col_ok[None, :], other=0)
    low, high = nibble_values(packed)
    p = tl.dot(a_low, low.to(a_low.dtype))
    return tl.dot(a_high, high.to(a_low.dtype), p)


@triton.jit
def group_scales(scale_ptr, rows, col_ok, k, K, group_size):
    """float32 [BN]: the scales of weight rows `rows` (int64 indices into scale_ptr's [rows, ceil(K / group)]) for
    the group holding element k; zero on rows not col_ok."""
    groups = (K + group_size - 1) // group_size
    return tl.load(scale_ptr + rows * groups + k // group_size, mask=col_ok, other=0.0).to(tl.float32)
