"""Random inputs of the MoEExperts op (tests/test_moe_experts*.py, tests/moe_interpreter_check.py)."""

import math

import torch

from et_trt_backend import moe_experts


def make_inputs(tokens, top_k, experts, hidden, ffn, activation, *, dtype=torch.bfloat16, bias=False,
                weights_dtype=torch.float32, invalid=0.0, seed=0):
    """Random inputs of the op; `invalid` of the ids out of [0, E) (negative or past the end)."""
    g = torch.Generator().manual_seed(seed)
    rows = 2 * ffn if moe_experts.is_gated(activation) else ffn
    hidden_states = torch.randn(tokens, hidden, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, top_k, dtype=torch.long)
    bad = torch.rand(ids.shape, generator=g) < invalid
    wild = torch.where(torch.rand(ids.shape, generator=g) < 0.5, -1 - ids, experts + ids)
    ids = torch.where(bad, wild, ids).to(torch.int32)
    weights = torch.rand(tokens, top_k, generator=g).to(weights_dtype)
    w_gate_up = (torch.randn(experts, rows, hidden, generator=g) / math.sqrt(hidden)).to(dtype)
    w_down = (torch.randn(experts, hidden, ffn, generator=g) / math.sqrt(ffn)).to(dtype)
    b_gate_up = (torch.randn(experts, rows, generator=g) * 0.1).to(dtype) if bias else None
    b_down = (torch.randn(experts, hidden, generator=g) * 0.1).to(dtype) if bias else None
    return hidden_states, ids, weights, w_gate_up, w_down, b_gate_up, b_down


def e4m3_tie_rows(tokens, size):
    """bfloat16 hidden states [tokens, size >= 61] for the FP8 form's per-token quantization: amax 1.53125 (times
    2^(row - 3)) and 30 values of each sign whose quotients by the row's scale (amax / 448) round to another e4m3
    value than their products with 448 / amax (what the kernels once computed)."""
    amax = torch.tensor(1.53125)
    values = torch.arange(2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    values = values[values < amax]
    by_scale = (values / (amax / torch.tensor(448.0))).to(torch.float8_e4m3fn).float()
    by_inverse = (values * (torch.tensor(448.0) / amax)).to(torch.float8_e4m3fn).float()
    ties = values[by_scale != by_inverse]
    assert ties.numel() == 30, ties.numel()
    row = torch.cat([amax[None], ties, -ties])
    row = torch.nn.functional.pad(row, (0, size - row.numel()))
    return (row * 2.0 ** (torch.arange(tokens) - 3)[:, None]).to(torch.bfloat16)
