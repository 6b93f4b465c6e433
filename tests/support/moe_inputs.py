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
