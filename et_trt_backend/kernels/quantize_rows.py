"""Triton source of the row quantization before an FP8 grouped GEMM (et_trt_backend/quantization.py's form).

    a_scale[r] = amax_k |a[r, k]| / 448     (1 where the row is all zeros)
    a_q[r, k]  = e4m3(a[r, k] / a_scale[r]), saturated to +-448, rounded to nearest even

a [rows, K] bf16 or fp16, a_q [rows, K] float8 e4m3 and a_scale [rows] float32, all dense.
Each program takes BLOCK_M rows and reads them twice (amax, then the quotients): the second
read hits L2. Runs on the GPU before the GEMM, on the same stream, so nothing waits on the host.
The launcher (runtime/kernels) launches ceil(rows / BLOCK_M) programs. One image is compiled
for K % 16 == 0 (16-byte rows: vector loads and stores; every fast FP8 GEMM needs it anyway),
one for any K. Both quotients are IEEE divisions (div_rn), as the reference computes them.
LAUNCH_DEPENDENTS (sm_90+): lets the GEMM launched after it with programmatic stream serialization
start at once; the GEMM waits for this grid (griddepcontrol) before it reads a_q or a_scale.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

E4M3_MAX = tl.constexpr(448.0)  # the largest finite float8 e4m3fn value


@triton.jit
def quantize_rows_kernel(a_ptr, q_ptr, scale_ptr, rows, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                         LAUNCH_DEPENDENTS: tl.constexpr):
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    base = rm.to(tl.int64)[:, None] * K
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (rk < K)[None, :]
        x = tl.load(a_ptr + base + rk[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), 1))
    scale = tl.where(amax > 0, tl.math.div_rn(amax, E4M3_MAX), 1.0)
    tl.store(scale_ptr + rm, scale, mask=row_ok)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (rk < K)[None, :]
        x = tl.load(a_ptr + base + rk[None, :], mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -E4M3_MAX), E4M3_MAX)
        tl.store(q_ptr + base + rk[None, :], q.to(tl.float8e4nv), mask=mask)
