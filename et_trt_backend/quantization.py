"""FP8 experts: the quantization every et-trt FP8 path follows, and its reference GroupedMM.

FP8 is e4m3 (torch.float8_e4m3fn, largest finite 448) with one float32 scale
per row of the operand's last dimension, computed from the values themselves
(no calibration data):

- weights [G, N, K] (the layout the FP8 kernels take): b_scale[g, n] =
  amax_k |w[g, n, k]| / 448 (1.0 where that amax is 0), b_q = e4m3 of
  w / b_scale rounded to nearest even and saturated to +-448; so
  w[g, n, k] ~= float(b_q[g, n, k]) * b_scale[g, n]. The export does this once
  (lowering/fp8_experts.py).
- activations [rows, K], at run time on the GPU: a_scale[r] = amax_k |a[r, k]|
  / 448 (1.0 where 0), a_q = e4m3(sat(a / a_scale)).
- out[r, n] = (sum_k float(a_q[r, k]) * float(b_q[g, n, k])) * a_scale[r] *
  b_scale[g, n] for the rows of group g (GroupedMM's groups: start_0 = 0,
  end_g = clamp(offs[g], start_g, rows), start_{g+1} = end_g; rows no group
  covers are zero), then rounded to a's dtype by whoever returns it.

The scale math is float32 as the kernels do it. The reference runs on the CPU
or the GPU (any device torch runs on) and accumulates the exact products of
two e4m3 values in float64: it is at least as exact as a kernel's float32
accumulation, and TF32 settings cannot touch it.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value


def _quantize_last_dim(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 scales over the last dimension) of a floating tensor."""
    if not x.dtype.is_floating_point or x.dtype == FP8_DTYPE:
        raise ValueError(f"FP8 quantization takes a bf16, fp16 or float32 tensor, got {x.dtype}")
    x32 = x.float()
    amax = x32.abs().amax(dim=-1)
    # A tensor divisor: torch divides by a Python number as a product with its reciprocal, which is one
    # ulp off amax / 448 for some amax (the H200 run saw 1 in 300 rows), and the kernels divide exactly.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    # Saturate before the cast: torch turns values beyond 448 into NaN, not 448. The cast rounds to
    # nearest even.
    q = (x32 / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize_weights_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(b_q float8_e4m3fn [G, N, K], b_scale float32 [G, N]) of weights w [G, N, K].

    Weights with inf or NaN have no FP8 form: refused (ValueError), as a scale from them would
    turn every other weight of their row into zero or NaN."""
    if w.dim() != 3:
        raise ValueError(f"FP8 weights are [G, N, K] (groups, output channels, inner dimension); got {w.dim()}-D "
                         f"{list(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("the weights hold inf or NaN, which FP8 with per-channel scales cannot represent; keep "
                         "these experts in the part's precision (leave expert_precision unset) or fix the weights")
    return _quantize_last_dim(w)


def quantize_rows_fp8(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a_q float8_e4m3fn [rows, K], a_scale float32 [rows]) of activations a [rows, K]: what the
    run-time row-quantization kernel computes."""
    if a.dim() != 2:
        raise ValueError(f"activations are [rows, K]; got {a.dim()}-D {list(a.shape)}")
    return _quantize_last_dim(a)


def swiglu_rows(x: torch.Tensor) -> torch.Tensor:
    """The SwiGLU of a gate+up output x [rows, 2K]: silu(x[:, :K]) * x[:, K:] in x's dtype, rounded as an
    exported model's ops round it (silu as g * sigmoid(g) in float32, rounded to x's dtype; then the product,
    rounded): what an FP8 GroupedMM of activation "swiglu" quantizes (kernels/quantize_rows.py's SWIGLU)."""
    if x.dim() != 2 or x.shape[1] % 2 != 0:
        raise ValueError(f"a gate+up output is [rows, 2K]; got {list(x.shape)}")
    gate, up = x.chunk(2, dim=1)
    g = gate.float()
    silu = (g * torch.sigmoid(g)).to(x.dtype)
    return (silu.float() * up.float()).to(x.dtype)


def grouped_mm_fp8_reference(a: torch.Tensor, b_q: torch.Tensor, b_scale: torch.Tensor,
                             offs: torch.Tensor) -> torch.Tensor:
    """float32 [rows, N]: the FP8 GroupedMM of a [rows, K] (quantized per row here) with b_q [G, N, K]
    and b_scale [G, N], groups as GroupedMM's (any offs is safe)."""
    if b_q.dtype != FP8_DTYPE or b_scale.dtype != torch.float32:
        raise ValueError(f"b_q must be {FP8_DTYPE} and b_scale float32, got {b_q.dtype} and {b_scale.dtype}")
    groups, n, k = b_q.shape
    if a.dim() != 2 or a.shape[1] != k or tuple(b_scale.shape) != (groups, n) or tuple(offs.shape) != (groups,):
        raise ValueError(f"shapes do not fit: a {list(a.shape)} (want [rows, {k}]), b_q {list(b_q.shape)}, "
                         f"b_scale {list(b_scale.shape)} (want [{groups}, {n}]), offs {list(offs.shape)} "
                         f"(want [{groups}])")
    a_q, a_scale = quantize_rows_fp8(a)
    rows = a.shape[0]
    out = torch.zeros(rows, n, dtype=torch.float32, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        end = min(max(int(end), start), rows)
        if end > start:
            sums = (a_q[start:end].double() @ b_q[g].double().T).float()
            out[start:end] = sums * a_scale[start:end, None] * b_scale[g]
        start = end
    return out
