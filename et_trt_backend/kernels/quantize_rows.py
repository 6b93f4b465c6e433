"""Triton source of the row quantization before an FP8 grouped GEMM (et_trt_backend/quantization.py's form).

    a_scale[r] = amax_k |a[r, k]| / 448     (1 where the row is all zeros)
    a_q[r, k]  = e4m3(a[r, k] / a_scale[r]), saturated to +-448, rounded to nearest even

a [rows, K] bf16 or fp16, a_q [rows, K] float8 e4m3 and a_scale [rows] float32, all dense.
Each program takes BLOCK_M rows and reads them twice (amax, then the quotients): the second
read hits L2. With WHOLE_ROWS (K <= BLOCK_K) it reads each row once and keeps it in registers:
faster where few rows make the launch latency-bound, slower at large row counts (fewer bytes in
flight). Runs on the GPU before the GEMM, on the same stream, so nothing waits on the host.
The launcher (runtime/kernels) launches ceil(rows / BLOCK_M) programs. Images are compiled for
K % 16 == 0 (16-byte rows: vector loads and stores; every fast FP8 GEMM needs it anyway), two
reads and whole rows, and for any K (aot.QUANTIZE_VARIANTS).
SWIGLU: a is a gate+up GEMM's output x [rows, 2K] and the rows quantized are its SwiGLU,
    a[r, k] = round(round(silu(x[r, k])) * x[r, K + k])     (silu(g) = g * sigmoid(g) in float32)
rounded to a's dtype at each step as the partition's bf16/fp16 ops round them (sigmoid within a few
float32 ulps), so the down GEMM's FP8 GroupedMM reads x once instead of a SwiGLU kernel writing a and
this kernel reading it back. Its whole-row image serves every launch with K <= its block: computing
each SwiGLU once beats two reads that compute it twice.
LAUNCH_DEPENDENTS (sm_90+): lets the GEMM launched after it with programmatic stream serialization
start at once; the GEMM waits for this grid (griddepcontrol) before it reads a_q or a_scale.

The scale is an IEEE division (div_rn, once per row). So are the quotients a / a_scale, but computed
without the division's per-element branch to its slow path (which serializes a kernel of few rows):
y = RN(1 / s) once per row, q = RN(x * y), one fma correction on the exact remainder, and x's sign
(the correction turns -0 into +0). Rows of scale below 2^-64 are taken times 2^64 first (exact:
powers of two) so that no remainder underflows where the quotient can reach e4m3's range. That this
equals IEEE division for every bf16 and fp16 value is tested on the GPU over every pair of mantissas
(tests/test_kernel_gpu.py).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, libdevice

E4M3_MAX = tl.constexpr(448.0)  # the largest finite float8 e4m3fn value
# Rows of scale below SMALL_SCALE are taken times LIFT: the remainder of every quotient that can round to a
# nonzero e4m3 value then stays a normal float32.
SMALL_SCALE = tl.constexpr(5.421010862427522e-20)  # 2^-64
LIFT = tl.constexpr(1.8446744073709552e19)  # 2^64


@triton.jit
def _quotient(x, divisor, inverse):
    """RN(x / divisor) from inverse = RN(1 / divisor), for the bf16 and fp16 values x can hold."""
    q = x * inverse
    q = tl.fma(tl.fma(-q, divisor, x), inverse, q)
    return libdevice.copysign(q, x)


@triton.jit
def _row_scales(amax):
    """(a_scale, the divisor the quotients take, its inverse RN(1 / divisor), the rows' lift) from rows' amax."""
    scale = tl.where(amax > 0, tl.math.div_rn(amax, E4M3_MAX), 1.0)
    lift = tl.where(scale < SMALL_SCALE, LIFT, 1.0)
    divisor = scale * lift
    return scale, divisor, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), divisor), lift


@triton.jit
def _quantized(x, divisor, inverse, lift):
    """e4m3(x / a_scale) of rows x, saturated, from _row_scales' divisor, inverse and lift."""
    q = _quotient(x * lift[:, None], divisor[:, None], inverse[:, None])
    return tl.minimum(tl.maximum(q, -E4M3_MAX), E4M3_MAX).to(tl.float8e4nv)


@triton.jit
def _block(a_ptr, a_base, rk, K, mask, SWIGLU: tl.constexpr):
    """Columns rk of the rows to quantize, in float32 (a's values, or SWIGLU's of x)."""
    x = tl.load(a_ptr + a_base + rk[None, :], mask=mask, other=0.0)
    if SWIGLU:
        up = tl.load(a_ptr + a_base + K + rk[None, :], mask=mask, other=0.0)
        gate = x.to(tl.float32)
        # Triton's sigmoid (exp2 and division approximate, as TensorRT's pointwise kernels take them). With
        # IEEE's the kernel is bound by its arithmetic and no faster than the two launches it replaces (H200)
        silu = (gate * tl.sigmoid(gate)).to(x.dtype)
        x = (silu.to(tl.float32) * up.to(tl.float32)).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def quantize_rows_kernel(a_ptr, q_ptr, scale_ptr, rows, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                         LAUNCH_DEPENDENTS: tl.constexpr, WHOLE_ROWS: tl.constexpr, SWIGLU: tl.constexpr):
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    base = rm.to(tl.int64)[:, None] * K
    a_base = base * 2 if SWIGLU else base
    if WHOLE_ROWS:  # K <= BLOCK_K: each row is read once and stays in registers for its quotients
        rk = tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (rk < K)[None, :]
        x = _block(a_ptr, a_base, rk, K, mask, SWIGLU)
        scale, divisor, inverse, lift = _row_scales(tl.max(tl.abs(x), 1))
        tl.store(scale_ptr + rm, scale, mask=row_ok)
        tl.store(q_ptr + base + rk[None, :], _quantized(x, divisor, inverse, lift), mask=mask)
    else:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (rk < K)[None, :]
            amax = tl.maximum(amax, tl.max(tl.abs(_block(a_ptr, a_base, rk, K, mask, SWIGLU)), 1))
        scale, divisor, inverse, lift = _row_scales(amax)
        tl.store(scale_ptr + rm, scale, mask=row_ok)
        for k in range(0, K, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (rk < K)[None, :]
            x = _block(a_ptr, a_base, rk, K, mask, SWIGLU)
            tl.store(q_ptr + base + rk[None, :], _quantized(x, divisor, inverse, lift), mask=mask)
