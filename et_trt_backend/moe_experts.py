"""The MoEExperts op's semantics (issue 32): one function from top-k ids to the combined output, in float32.

    out[t] = sum over j < k with 0 <= e = topk_ids[t, j] < E of
             topk_weights[t, j] * down_e(act(gate_up_e(hidden[t])))
    gate_up_e(x) = x @ w_gate_up[e]^T (+ b_gate_up[e]),  down_e(y) = y @ w_down[e]^T (+ b_down[e])

hidden [T, H] bf16 or fp16 (T may be 0); topk_ids [T, k] int32, any values (ids outside [0, E) contribute
nothing); topk_weights [T, k] float32 or hidden's dtype; w_gate_up [E, N1, H] and w_down [E, H, F] in hidden's
dtype (weights as [E, out, in]); b_gate_up [E, N1] and b_down [E, H] optional, in hidden's dtype. Gated
activations (plugin_names.MOE_GATED_ACTIVATIONS) take N1 = 2F rows, gate and up rows where gate_up_layout says
(plugin_names.MOE_GATE_UP_LAYOUTS); the others N1 = F.

Rounding, as the partition's bf16/fp16 PyTorch ops round: products accumulate in float32; the gate+up output
(bias included) is rounded to hidden's dtype before the activation, the activation's result (computed in
float32) rounded to hidden's dtype: the down GEMM's input; the down output (bias included) stays float32 through
the weighted sum over j (in order of j), which is rounded once at the end.

`reference` is the one definition: the lowering's op (torch.ops.et_trt_lowering.moe_experts) calls it, and the
kernels (et_trt_backend/kernels/moe_experts.py, the eager op torch.ops.et_trt.moe_experts) are tested against it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from et_trt_backend.plugin_names import MOE_ACTIVATIONS, MOE_GATE_UP_LAYOUTS, MOE_GATED_ACTIVATIONS

GPTOSS_ALPHA = 1.702  # GPT-OSS's defaults for gptoss_glu's float attributes
GPTOSS_LIMIT = 7.0
# float32 too: the float32 twins that tests and the lowering's block check compute in (every rounding a no-op).
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def is_gated(activation: str) -> bool:
    _check_activation(activation)
    return activation in MOE_GATED_ACTIVATIONS


def layout_block(layout: str, ffn: int) -> int:
    """The block B of a gate+up row layout: feature f's gate row is (f // B) * 2B + f % B, its up row that + B."""
    if layout not in MOE_GATE_UP_LAYOUTS:
        raise ValueError(f"unknown gate_up_layout {layout!r}; use one of {MOE_GATE_UP_LAYOUTS}")
    if layout == "blocked8" and ffn % 8:
        raise ValueError(f"gate_up_layout 'blocked8' needs the FFN size to be a multiple of 8; got {ffn} "
                         "(keep 'concat' or 'interleaved' for this layer)")
    return {"concat": max(ffn, 1), "interleaved": 1, "blocked8": 8}[layout]


def gate_up_rows(layout: str, ffn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate rows, up rows) of features 0..F-1 among the 2F rows of one expert's gate+up weights."""
    block = layout_block(layout, ffn)
    f = torch.arange(ffn)
    gate = f // block * 2 * block + f % block
    return gate, gate + block


def relayout(w_gate_up: torch.Tensor, b_gate_up: torch.Tensor | None, source: str, target: str):
    """Gated experts' gate+up weights [E, 2F, H] (and bias [E, 2F]) with their rows moved from layout `source`
    to `target`: what the lowering does at export to give the kernels the layout they read fastest."""
    ffn = w_gate_up.shape[1] // 2
    order = torch.empty(2 * ffn, dtype=torch.long)
    for src, dst in zip(gate_up_rows(source, ffn), gate_up_rows(target, ffn)):
        order[dst] = src
    return w_gate_up[:, order], None if b_gate_up is None else b_gate_up[:, order]


def activate(gate_up: torch.Tensor, activation: str, gate_up_layout: str = "concat", alpha: float = GPTOSS_ALPHA,
             limit: float = GPTOSS_LIMIT) -> torch.Tensor:
    """The activation in float32 of a gate+up output [rows, N1] (already rounded to the part's dtype)."""
    x = gate_up.float()
    if not is_gated(activation):
        if activation == "silu":
            return F.silu(x)
        if activation == "relu2":
            return F.relu(x).square()
        return F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")
    gate_rows, up_rows = gate_up_rows(gate_up_layout, x.shape[1] // 2)
    g, u = x[:, gate_rows], x[:, up_rows]
    if activation == "swiglu":
        return F.silu(g) * u
    if activation == "gptoss_glu":
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
        return (u + 1) * g * torch.sigmoid(alpha * g)
    return F.gelu(g, approximate="tanh" if activation == "geglu_tanh" else "none") * u


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def _check_activation(activation: str) -> None:
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"unknown MoE activation {activation!r}; use one of {tuple(MOE_ACTIVATIONS)}")


def check_inputs(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation: str,
                 gate_up_layout: str) -> tuple[int, int, int, int, int]:
    """(T, k, E, H, F) of valid inputs; a ValueError naming the input and what it must be otherwise."""
    _check_activation(activation)
    if hidden.dim() != 2 or hidden.dtype not in _FLOATS:
        raise ValueError(f"moe_experts: hidden must be [T, H] bfloat16 or float16 (float32 for checks); got "
                         f"{hidden.dtype} {tuple(hidden.shape)}")
    tokens, size = hidden.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens or topk_ids.dtype != torch.int32:
        raise ValueError(f"moe_experts: topk_ids must be int32 [T, k] with T = {tokens}; got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    top_k = topk_ids.shape[1]
    if tuple(topk_weights.shape) != (tokens, top_k) or topk_weights.dtype not in (torch.float32, hidden.dtype):
        raise ValueError(f"moe_experts: topk_weights must be [T, k] = [{tokens}, {top_k}] in float32 or hidden's "
                         f"{hidden.dtype}; got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if w_down.dim() != 3 or w_down.shape[1] != size or w_down.dtype != hidden.dtype:
        raise ValueError(f"moe_experts: w_down must be [E, H, F] with H = {size} in {hidden.dtype}; got "
                         f"{w_down.dtype} {tuple(w_down.shape)}")
    experts, _, ffn = w_down.shape
    rows = 2 * ffn if is_gated(activation) else ffn
    if tuple(w_gate_up.shape) != (experts, rows, size) or w_gate_up.dtype != hidden.dtype:
        raise ValueError(f"moe_experts: w_gate_up must be [E, N1, H] = [{experts}, {rows}, {size}] in {hidden.dtype} "
                         f"(N1 = {'2F' if rows != ffn else 'F'} for {activation}); got {w_gate_up.dtype} "
                         f"{tuple(w_gate_up.shape)}")
    for name, bias, shape in (("b_gate_up", b_gate_up, (experts, rows)), ("b_down", b_down, (experts, size))):
        if bias is not None and (tuple(bias.shape) != shape or bias.dtype != hidden.dtype):
            raise ValueError(f"moe_experts: {name} must be {list(shape)} in {hidden.dtype}; got {bias.dtype} "
                             f"{tuple(bias.shape)}")
    if is_gated(activation):
        layout_block(gate_up_layout, ffn)
    return tokens, top_k, experts, size, ffn


def reference(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, *,
              activation: str = "swiglu", gate_up_layout: str = "concat", alpha: float = GPTOSS_ALPHA,
              limit: float = GPTOSS_LIMIT) -> torch.Tensor:
    """out [T, H] in hidden's dtype, by the module docstring's semantics, in float32 where hidden is (the CPU, or a
    GPU for large checks: its float32 matmuls, TF32 off as PyTorch's default, are float32's)."""
    check_inputs(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation, gate_up_layout)
    return compute(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, activation=activation,
                   gate_up_layout=gate_up_layout, alpha=alpha, limit=limit)


def compute(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
            w_down: torch.Tensor, b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None, *, activation: str,
            gate_up_layout: str, alpha: float, limit: float,
            quantize_gate_up: Callable[[torch.Tensor], torch.Tensor] = _unchanged,
            quantize_down: Callable[[torch.Tensor], torch.Tensor] = _unchanged) -> torch.Tensor:
    """`reference`'s arithmetic on inputs check_inputs accepted, except that the weights may be of another float type:
    float32 (the INT4 form's exact q * scale, int4_weights.moe_experts_reference), or the model's bf16 under float32
    hidden states (the lowering's check, lowering/moe_fusion.py: each routed expert converted alone).
    `quantize_gate_up` and `quantize_down` (float32 rows -> float32 rows) are applied to the two GEMMs' input rows:
    the FP8 form's activations (moe_experts_fp8.reference)."""
    dtype, device = hidden.dtype, hidden.device
    tokens, size = hidden.shape
    top_k, experts = topk_ids.shape[1], w_down.shape[0]
    x = quantize_gate_up(hidden.detach().float())
    ids = topk_ids.detach().to(device, torch.long)
    weights = topk_weights.detach().to(device, torch.float32)

    def f32(t: torch.Tensor | None, e: int) -> torch.Tensor | None:
        return None if t is None else t[e].detach().to(device, torch.float32)

    pairs = torch.zeros(tokens, top_k, size, device=device)  # each pair's weighted down output, float32
    for e in ids[(ids >= 0) & (ids < experts)].unique().tolist():
        token, slot = (ids == e).nonzero(as_tuple=True)
        gate_up = x[token] @ f32(w_gate_up, e).T
        if b_gate_up is not None:
            gate_up += f32(b_gate_up, e)
        h = activate(gate_up.to(dtype), activation, gate_up_layout, alpha, limit).to(dtype).float()
        y = quantize_down(h) @ f32(w_down, e).T
        if b_down is not None:
            y += f32(b_down, e)
        pairs[token, slot] = y * weights[token, slot, None]
    out = pairs[:, 0] if top_k else torch.zeros(tokens, size, device=device)
    for j in range(1, top_k):  # in order of j, as the kernels' combine sums
        out = out + pairs[:, j]
    return out.to(dtype)
