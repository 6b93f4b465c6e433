"""The FP8 MoE experts GEMMs' Triton source (kernels/moe_fp8.py) in Triton's interpreter on the CPU.

Run by tests/test_moe_experts_fp8.py in a subprocess with TRITON_INTERPRET=1. Launches route + hidden's
quantization, FP8 gate+up, FP8 down and combine as the launcher does, every buffer poisoned first (NaN
activations, scales, down rows and output; -1 in the routing buffers), and compares the output with
moe_experts_fp8.reference (the same activation quantization in float32 math): relative error <= 2e-2 (mostly
equal; where the GEMMs' float32 sums, in another order than torch's, put a gate+up output one bf16 ulp off, its e4m3
value and, if it is its block's amax, the block's scale may differ: a row then differs by about e4m3's rounding
error), and with moe_experts.reference in float32 of the
same FP8 weights (the activations' e4m3 roundings included) <= 5e-2; checks hidden's e4m3 values and scales bit for
bit against quantization.quantize_rows_fp8 (rows whose quotients lie at e4m3 rounding ties included) and each row's
block scales: the amax of its 128 features over 448. Inputs are float16 (the FP8 GEMMs have no bfloat16 tl.dot,
which the interpreter gets wrong: moe_interpreter_check.py), and bfloat16 at the plugin check's sizes (one token,
top-1). The down GEMM's sweep candidates (moe_fp8_down.py) run in the shipped down's place at a few of these
sizes. Prints "fp8 interpreter ok" last.

Triton 3.9's interpreter converts float32 to e4m3 by truncating the mantissa and adding the rounding bit without
its carry (1.97 becomes 1.0), and float32 to bfloat16 by truncation. The GPU's cvt rounds both to nearest even; so
does torch. This script converts them with torch in the interpreter, so the check measures the kernels, not those
bugs. The interpreter has no CUDA libdevice either: its copysign (quantize_rows.py's quotients) is done here on the
bits.
"""

import types

import numpy as np
import torch
import triton
import triton.language as tl
from support.moe_inputs import e4m3_tie_rows, make_inputs
from triton.runtime import interpreter

from et_trt_backend import moe_experts, moe_experts_fp8
from et_trt_backend.kernels import moe_experts as kernels
from et_trt_backend.kernels import moe_fp8, moe_fp8_down, quantize_rows
from et_trt_backend.plugin_names import MOE_ACTIVATIONS
from et_trt_backend.quantization import quantize_rows_fp8

_convert_float = interpreter._convert_float
_ROUNDED_BY_TORCH = {tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8), tl.bfloat16: (torch.bfloat16, torch.int16)}


def _convert_float_rn(data, input_dtype, output_dtype, rounding_mode):
    if input_dtype == tl.float32 and output_dtype in _ROUNDED_BY_TORCH:
        dtype, bits = _ROUNDED_BY_TORCH[output_dtype]
        values = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
        return values.to(dtype).view(bits).numpy().view(f"uint{bits.itemsize * 8}").reshape(data.shape)
    return _convert_float(data, input_dtype, output_dtype, rounding_mode)


@triton.jit
def _copysign(magnitude, sign):
    bits = magnitude.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return (bits | (sign.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True)


def _patch_interpreter():
    # Only when run as the script: an importer (pytest collecting tests/) keeps the real libdevice and conversion.
    interpreter._convert_float = _convert_float_rn
    quantize_rows.libdevice = types.SimpleNamespace(copysign=_copysign)


def run(hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation, layout, block_m=16, down_k=64,
        chunk=16, e_pad=16, split_k=None):
    """The four launches; w_gate_up and w_down are (e4m3, scale) pairs. split_k None: the shipped down kernel;
    False or True: moe_fp8_down.py's sweep candidate (K steps of 128 or 64)."""
    tokens, size = hidden.shape
    top_k, experts, ffn = ids.shape[1], w_down[0].shape[0], w_down[0].shape[2]
    pairs = tokens * top_k
    max_tiles = triton.cdiv(pairs, block_m) + min(experts, pairs)
    offs = torch.full((experts,), -1, dtype=torch.int32)
    order = torch.full((pairs,), -1, dtype=torch.int32)
    tiles = torch.full((1 + 2 * max_tiles,), -1, dtype=torch.int32)
    xq = torch.full((tokens, size), float("nan")).to(torch.float8_e4m3fn)
    xs = torch.full((tokens,), float("nan"))
    h = torch.full((pairs, ffn), float("nan")).to(torch.float8_e4m3fn)
    h_scale = torch.full((pairs, triton.cdiv(ffn, 128)), float("nan"))
    y = torch.full((pairs, size), float("nan"))
    out = torch.full((tokens, size), float("nan"), dtype=hidden.dtype)
    gated = moe_experts.is_gated(activation)
    block = moe_experts.layout_block(layout, ffn) if gated else 1
    no_bias = torch.empty(1, dtype=hidden.dtype)
    route_programs = triton.cdiv(pairs, chunk)
    quantize_programs = triton.cdiv(tokens, 4)
    moe_fp8.moe_fp8_route_kernel[(route_programs + quantize_programs,)](
        ids, offs, order, tiles, pairs, experts, block_m, hidden, xq, xs, tokens, size, route_programs, CHUNK=chunk,
        E_PAD=e_pad, BLOCK_T=4)
    assert not xs.isnan().any(), "hidden's scales not all written"
    moe_fp8.moe_fp8_gate_up_kernel[(max_tiles, triton.cdiv(ffn, 128))](
        xq, xs, order, *w_gate_up, no_bias if b_gate_up is None else b_gate_up, tiles, offs, h, h_scale, size, ffn,
        top_k, block, MOE_ACTIVATIONS[activation], moe_experts.GPTOSS_ALPHA, moe_experts.GPTOSS_LIMIT,
        int(b_gate_up is not None), GATED=gated, BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=down_k)
    down_args = (h, h_scale, order, *w_down, no_bias if b_down is None else b_down, weights, tiles, offs, y, size,
                 ffn, int(b_down is not None), int(weights.dtype != torch.float32))
    if split_k is None:
        moe_fp8.moe_fp8_down_kernel[(max_tiles, triton.cdiv(size, 32))](*down_args, BLOCK_M=block_m, BLOCK_N=32,
                                                                        BLOCK_K=down_k)
    else:
        moe_fp8_down.moe_fp8_down_candidate_kernel[(max_tiles, triton.cdiv(size, 32))](
            *down_args, BLOCK_M=block_m, BLOCK_N=32, BLOCK_K=64 if split_k else 128, SPLIT_K=split_k)
    kernels.moe_combine_kernel[(triton.cdiv(tokens, 4), triton.cdiv(size, 16))](
        y, ids, out, tokens, size, top_k, experts, BLOCK_T=4, BLOCK_H=16)
    return out, h, h_scale, int(offs[-1]) if experts else 0, xq, xs


def _relative_error(x, reference):
    return float((x.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-6))


def check(name, inputs, activation="swiglu", layout="concat", float32_bound=5e-2, **blocks):
    hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = inputs
    gate_up_q, down_q = moe_experts_fp8.quantize_weights(w_gate_up, w_down)
    out, h, h_scale, valid, xq, xs = run(hidden, ids, weights, gate_up_q, down_q, b_gate_up, b_down, activation,
                                         layout, **blocks)
    assert not out.isnan().any(), (name, "unwritten (NaN-poisoned) outputs")
    want_q, want_scale = quantize_rows_fp8(hidden)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_scale), \
        (name, "hidden's e4m3 values or scales differ from quantization.quantize_rows_fp8")
    emulated = moe_experts_fp8.reference(hidden, ids, weights, gate_up_q, down_q, b_gate_up, b_down,
                                         activation=activation, gate_up_layout=layout)
    float32 = moe_experts.reference(hidden.float(), ids, weights.float(), moe_experts_fp8.dequantize(*gate_up_q),
                                    moe_experts_fp8.dequantize(*down_q),
                                    None if b_gate_up is None else b_gate_up.float(),
                                    None if b_down is None else b_down.float(), activation=activation,
                                    gate_up_layout=layout)
    err, err_float32 = _relative_error(out, emulated), _relative_error(out, float32)
    assert err <= 2e-2 and err_float32 <= float32_bound, (name, err, err_float32)
    # Each valid row's block scales: its blocks' amax / 448 (the largest e4m3 magnitude is 448), no NaN left.
    ffn = h.shape[1]
    values = h[:valid].float()
    assert not h_scale[:valid].isnan().any(), (name, "unwritten block scales")
    for b in range(h_scale.shape[1]):
        amax = values[:, b * 128:(b + 1) * 128].abs().amax(1)
        assert ((amax == 448) | ((amax == 0) & (h_scale[:valid, b] == 1))).all(), (name, "block scales", b, ffn)
    print(f"{name}: relative error {err:.2e} (FP8 reference), {err_float32:.2e} (float32 of the same weights)")


def main():
    torch.manual_seed(0)
    for activation in MOE_ACTIVATIONS:
        layouts = ("concat", "interleaved", "blocked8") if moe_experts.is_gated(activation) else ("concat",)
        for layout in layouts:
            inputs = make_inputs(9, 3, 5, 96, 136 if layout != "blocked8" else 144, activation,
                                 dtype=torch.float16, bias=True, invalid=0.15,
                                 seed=len(layout) + MOE_ACTIVATIONS[activation])
            check(f"{activation} {layout}", inputs, activation, layout)
    # float16 routing weights, odd sizes (H 40, F 13: masked K and N, one partial scale block), one token.
    check("odd sizes", make_inputs(7, 2, 5, 40, 13, "swiglu", dtype=torch.float16, weights_dtype=torch.float16,
                                   seed=3), down_k=32)
    # Hidden wider than a down scale block: one scale per token over its 300 columns.
    check("wide hidden", make_inputs(12, 2, 3, 300, 136, "swiglu", dtype=torch.float16, seed=8))
    check("one token", make_inputs(1, 2, 4, 64, 64, "gelu_tanh", dtype=torch.float16, seed=4), "gelu_tanh")
    # Skewed routing: every token to experts 0 and 1 (several m-tiles each), experts 2-4 empty, invalid ids.
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(37, 2, 5, 64, 128, "swiglu", dtype=torch.float16,
                                                                seed=5)
    ids = torch.stack([torch.zeros(37), torch.ones(37)], 1).int()
    ids[3, 0] = 5  # past the last expert
    ids[9, 1] = -(2**31)
    skewed = (hidden, ids, weights, w_gate_up, w_down, None, None)
    check("skewed", skewed, down_k=128)
    # Every id invalid: no tiles, every output row zero.
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(5, 2, 4, 32, 32, "silu", dtype=torch.float16, seed=6)
    for split_k in (None, False, True):
        out, _, _, valid, _, _ = run(hidden, torch.full_like(ids, 9), weights,
                                     *moe_experts_fp8.quantize_weights(w_gate_up, w_down), None, None, "silu",
                                     "concat", split_k=split_k)
        assert (out == 0).all() and valid == 0
    # The down GEMM's sweep candidates (moe_fp8_down.py), with K steps of 128 and 64: odd sizes (one partial scale
    # block: the split's second K step all masked), three scale blocks (the last partial), biases, float16 routing
    # weights, skewed routing (empty experts, invalid ids, several m-tiles of one expert), one token.
    for split_k in (False, True):
        check(f"down candidate split_k={split_k}: odd sizes",
              make_inputs(7, 2, 5, 40, 13, "swiglu", dtype=torch.float16, weights_dtype=torch.float16, seed=3),
              split_k=split_k)
        check(f"down candidate split_k={split_k}: three scale blocks",
              make_inputs(9, 2, 3, 48, 300, "swiglu", dtype=torch.float16, bias=True, invalid=0.1, seed=10),
              split_k=split_k)
        check(f"down candidate split_k={split_k}: skewed", skewed, split_k=split_k)
        check(f"down candidate split_k={split_k}: one token",
              make_inputs(1, 2, 4, 64, 64, "gelu_tanh", dtype=torch.float16, seed=4), "gelu_tanh", split_k=split_k)
    # bfloat16 at the plugin check's sizes, top-1 (the case an H100 saw 4.5e-2 off while the kernels divided
    # approximately), and hidden rows whose quotients lie at e4m3 rounding ties: x / scale rounds them one way,
    # x * (448 / amax) (the kernels' former quotient) the other.
    # One row of 64 outputs: its e4m3 roundings of hidden and h average over few values (7.5e-2 from float32).
    for tokens, float32_bound in ((1, 8e-2), (16, 5e-2)):
        check(f"bf16 {tokens} tokens", make_inputs(tokens, 1, 8, 64, 64, "swiglu", seed=tokens), layout="blocked8",
              float32_bound=float32_bound)
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(7, 1, 2, 64, 64, "swiglu", seed=9)
    # Values at ties are e4m3's worst case: each is half a step off (7.0e-2 from float32).
    check("e4m3 ties", (e4m3_tie_rows(7, 64), ids, weights, w_gate_up, w_down, None, None), float32_bound=1e-1)
    print("fp8 interpreter ok")


if __name__ == "__main__":
    _patch_interpreter()
    main()
