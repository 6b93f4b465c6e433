"""The MoE experts kernels' Triton source in Triton's interpreter on the CPU, against moe_experts.reference.

Run by tests/test_moe_experts_kernels.py in a subprocess with TRITON_INTERPRET=1 (the interpreter must be chosen
before Triton is imported). Launches the four kernels as runtime/kernels/moe_experts_launcher.cc does (grids,
workspace), with every buffer poisoned first: NaN in the activations, the down rows and the output, -1 in the
offsets, pairs and tile table, so an unwritten element or a row read before it is written fails the comparison.
Prints "interpreter ok" last. The inputs are float16: the interpreter's bfloat16 tl.dot is wrong (Triton 3.9:
off by 1e10 on unit inputs), its float16 one exact.
"""

import torch
import triton
from support.moe_inputs import make_inputs

from et_trt_backend import moe_experts
from et_trt_backend.kernels import moe_experts as kernels
from et_trt_backend.plugin_names import MOE_ACTIVATIONS


def run(hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation, layout, block_m=16, block_n=16,
        block_k=16, chunk=16, e_pad=16):
    tokens, size = hidden.shape
    top_k, experts, ffn = ids.shape[1], w_down.shape[0], w_down.shape[2]
    pairs = tokens * top_k
    max_tiles = triton.cdiv(pairs, block_m) + min(experts, pairs)
    offs = torch.full((experts,), -1, dtype=torch.int32)
    order = torch.full((pairs,), -1, dtype=torch.int32)
    tiles = torch.full((1 + 2 * max_tiles,), -1, dtype=torch.int32)
    h = torch.full((pairs, ffn), float("nan"), dtype=hidden.dtype)
    y = torch.full((pairs, size), float("nan"))
    out = torch.full((tokens, size), float("nan"), dtype=hidden.dtype)
    gated = moe_experts.is_gated(activation)
    block = moe_experts.layout_block(layout, ffn) if gated else 1
    no_bias = torch.empty(1, dtype=hidden.dtype)
    kernels.moe_route_kernel[(triton.cdiv(pairs, chunk),)](ids, offs, order, tiles, pairs, experts, block_m,
                                                           CHUNK=chunk, E_PAD=e_pad)
    kernels.moe_gate_up_kernel[(max_tiles, triton.cdiv(ffn, block_n))](
        hidden, order, w_gate_up, no_bias if b_gate_up is None else b_gate_up, tiles, offs, h, size, ffn, top_k,
        block, MOE_ACTIVATIONS[activation], moe_experts.GPTOSS_ALPHA, moe_experts.GPTOSS_LIMIT,
        int(b_gate_up is not None), GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    kernels.moe_down_kernel[(max_tiles, triton.cdiv(size, block_n))](
        h, order, w_down, no_bias if b_down is None else b_down, weights, tiles, offs, y, size, ffn,
        int(b_down is not None), int(weights.dtype != torch.float32), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k)
    kernels.moe_combine_kernel[(triton.cdiv(tokens, 4), triton.cdiv(size, 16))](
        y, ids, out, tokens, size, top_k, experts, BLOCK_T=4, BLOCK_H=16)
    return out, offs, order


def check(name, inputs, activation="swiglu", layout="concat", **blocks):
    out, offs, order = run(*inputs, activation, layout, **blocks)
    hidden, ids = inputs[0], inputs[1]
    experts = inputs[4].shape[0]
    want = moe_experts.reference(*inputs, activation=activation, gate_up_layout=layout)
    assert not out.isnan().any(), (name, "unwritten (NaN-poisoned) outputs")
    err = float((out.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6))
    assert err < 2e-3, (name, err)  # float16 products of the same roundings: equal but for a rare tie
    # The routing: offsets are the valid pairs' counts, and the pairs are sorted by expert, stable.
    flat = ids.flatten().long()
    valid = (flat >= 0) & (flat < experts)
    counts = torch.bincount(flat[valid], minlength=experts)
    assert torch.equal(offs.long(), counts.cumsum(0)), (name, offs, counts)
    stable = torch.argsort(torch.where(valid, flat, experts), stable=True)[:int(valid.sum())]
    assert torch.equal(order[:len(stable)].long(), stable), (name, "pairs not in stable expert order")
    print(f"{name}: relative error {err:.2e}")


def main():
    torch.manual_seed(0)
    for activation in MOE_ACTIVATIONS:
        layouts = ("concat", "interleaved", "blocked8") if moe_experts.is_gated(activation) else ("concat",)
        for layout in layouts:
            inputs = make_inputs(11, 3, 6, 32, 24 if layout != "blocked8" else 16, activation, dtype=torch.float16,
                                 bias=True, invalid=0.15, seed=len(layout) + MOE_ACTIVATIONS[activation])
            check(f"{activation} {layout}", inputs, activation, layout)
    # float16 routing weights, no biases, odd sizes (H 20, F 13: masked K and N), one token.
    check("odd sizes", make_inputs(7, 2, 5, 20, 13, "swiglu", dtype=torch.float16, weights_dtype=torch.float16,
                                   seed=3))
    check("one token", make_inputs(1, 2, 4, 16, 16, "gelu_tanh", dtype=torch.float16, seed=4), "gelu_tanh")
    # Skewed routing: every token to experts 0 and 1 (one expert's rows span several m-tiles), experts 2-4 empty;
    # 37 tokens x 2 pairs over 5 route programs of 16 pairs.
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(37, 2, 5, 16, 16, "swiglu", dtype=torch.float16, seed=5)
    ids = torch.stack([torch.zeros(37), torch.ones(37)], 1).int()
    ids[3, 0] = 5  # past the last expert
    ids[9, 1] = -(2**31)
    check("skewed", (hidden, ids, weights, w_gate_up, w_down, None, None))
    # Every id invalid: no tiles, every output row zero.
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(5, 2, 4, 16, 16, "silu", dtype=torch.float16, seed=6)
    out, offs, _ = run(hidden, torch.full_like(ids, 9), weights, w_gate_up, w_down, None, None, "silu", "concat")
    assert (out == 0).all() and (offs == 0).all()
    # More experts than one chunk's bins need: E 100 of E_PAD 128, route chunks of 32.
    check("100 experts", make_inputs(30, 4, 100, 16, 16, "relu2", dtype=torch.float16, seed=7), "relu2", chunk=32, e_pad=128)
    check_gather()
    check_combine_in_dtype()
    print("interpreter ok")


def check_combine_in_dtype():
    """moe_combine_kernel on rows y in the activations' dtype (the wgmma down's, variant "y_in_dtype") sums each
    token's valid pairs' rows in float32; invalid pairs' rows (NaN: never written) are not read."""
    _, ids, *_ = make_inputs(9, 3, 4, 24, 16, "swiglu", dtype=torch.float16, invalid=0.25, seed=9)
    tokens, top_k, size, experts = 9, 3, 24, 4
    y = torch.randn(tokens * top_k, size).half()
    valid = ((ids >= 0) & (ids < experts)).flatten()
    y[~valid] = float("nan")
    out = torch.full((tokens, size), float("nan"), dtype=torch.float16)
    kernels.moe_combine_kernel[(triton.cdiv(tokens, 4), triton.cdiv(size, 16))](
        y, ids, out, tokens, size, top_k, experts, BLOCK_T=4, BLOCK_H=16)
    want = torch.where(valid[:, None], y.double(), 0).view(tokens, top_k, size).sum(1)
    err = float((out.double() - want).abs().max() / want.abs().max())
    assert valid.any() and not valid.all() and err < 1e-3, ("combine in dtype", err)
    print(f"combine in dtype: max error {err:.2e}")


def check_gather():
    """moe_gather_kernel copies the valid pairs' rows of hidden in sorted order and nothing past them."""
    hidden, ids, *_ = make_inputs(13, 3, 5, 40, 16, "swiglu", dtype=torch.float16, invalid=0.2, seed=8)
    pairs, experts = ids.numel(), 5
    offs = torch.full((experts,), -1, dtype=torch.int32)
    order = torch.full((pairs,), -1, dtype=torch.int32)
    tiles = torch.full((1 + 2 * (pairs + experts),), -1, dtype=torch.int32)
    kernels.moe_route_kernel[(triton.cdiv(pairs, 16),)](ids, offs, order, tiles, pairs, experts, 16, CHUNK=16, E_PAD=16)
    gathered = torch.full((pairs, 40), float("nan"), dtype=hidden.dtype)
    kernels.moe_gather_kernel[(triton.cdiv(pairs, 4), triton.cdiv(40, 16))](hidden, order, offs, gathered, 40,
                                                                            experts, 3, BLOCK_R=4, BLOCK_H=16)
    valid = int(offs[-1])
    assert valid < pairs and torch.equal(gathered[:valid], hidden[order[:valid].long() // 3]), "gather"
    assert gathered[valid:].isnan().all(), "gather wrote past the valid pairs"
    print("gather: ok")


if __name__ == "__main__":
    main()
