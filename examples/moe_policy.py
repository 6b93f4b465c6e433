"""A small robot policy with two mixture-of-experts parts, for export examples and tests.

The policy reads observation tokens (a variable number of them: the exported
program's "tokens" dimension), encodes them with `decoder` and predicts a
flow-matching velocity for a fixed horizon of action tokens with `velocity`:

    context  = decoder(observations)                    # [tokens, hidden]
    velocity = velocity(noisy_actions, timestep, context)  # [horizon, action_dim]

Both parts hold MoE feed-forward layers written the way public MoE code writes
its `torch._grouped_mm` path: router linear -> softmax or sigmoid -> top-k ->
stable argsort of the expert ids -> histc / bincount-style counts -> int32
cumsum offsets -> gather the rows -> grouped GEMM (gate and up) -> SiLU * up ->
grouped GEMM (down) -> routing weight -> index_add / index_put combine. The
velocity MoE also has a shared expert, as DeepSeek- and Qwen-style models do.

Weights are random (seeded): nothing is downloaded. Everything is bf16, the
only dtype in which torch.export accepts `_grouped_mm` (see FACTS.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

OBS_DIM = 32
ACTION_DIM = 8
HORIZON = 8  # action tokens per prediction
HIDDEN = 64
EXPERT_FFN = 64
NUM_EXPERTS = 8
TOP_K = 2
MIN_TOKENS = 2
MAX_TOKENS = 512
DTYPE = torch.bfloat16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as public models do, then return to the input dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    """Single-head attention written with plain matmul + softmax (queries attend to `memory`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        k, v = self.kv(memory).chunk(2, dim=-1)
        scores = (q @ k.transpose(0, 1)) * self.scale
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        return self.out(probs @ v)


class Router(nn.Module):
    """Router linear -> softmax or sigmoid -> top-k (weights renormalised for sigmoid)."""

    def __init__(self, dim: int, num_experts: int, top_k: int, scoring: str):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, dim))
        self.top_k = top_k
        self.scoring = scoring

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        if self.scoring == "softmax":
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = torch.sigmoid(logits)
        weights, experts = torch.topk(scores, self.top_k, dim=-1)
        if self.scoring == "sigmoid":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts


class GroupedExperts(nn.Module):
    """Expert weights stored as [experts, out, in] (like nn.Linear), run with torch._grouped_mm."""

    def __init__(self, dim: int, ffn: int, num_experts: int, combine: str):
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * ffn, dim))
        self.down = nn.Parameter(torch.empty(num_experts, dim, ffn))
        self.num_experts = num_experts
        self.combine = combine

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        top_k = experts.shape[-1]
        flat_experts = experts.reshape(-1)
        # Rows grouped by expert; a stable sort keeps token order inside each group.
        order = torch.argsort(flat_experts, stable=True)
        token_of_row = order // top_k
        counts = torch.histc(flat_experts.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)

        rows = x[token_of_row]
        gate, up = torch._grouped_mm(rows, self.gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        rows = torch._grouped_mm(F.silu(gate) * up, self.down.transpose(-2, -1), offs=offsets)
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1)

        if self.combine == "index_add":
            return torch.zeros_like(x).index_add(0, token_of_row, rows)
        # index_put: put rows back in (token, k) order, then sum the k picks of each token.
        unsorted = torch.zeros_like(rows)
        unsorted[order] = rows
        return unsorted.view(x.shape[0], top_k, x.shape[-1]).sum(dim=1)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class MoE(nn.Module):
    def __init__(self, dim: int, ffn: int, num_experts: int, top_k: int, scoring: str, combine: str, shared: bool):
        super().__init__()
        self.router = Router(dim, num_experts, top_k, scoring)
        self.experts = GroupedExperts(dim, ffn, num_experts, combine)
        self.shared_expert = SwiGLU(dim, ffn) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.router(x)
        out = self.experts(x, weights, experts)
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: attention over `memory` (itself when None), then a MoE FFN."""

    def __init__(self, dim: int, moe: MoE):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim)
        self.ffn_norm = RMSNorm(dim)
        self.moe = moe

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        h = self.attn_norm(x)
        x = x + self.attn(h, h if memory is None else memory)
        return x + self.moe(self.ffn_norm(x))


class Decoder(nn.Module):
    """Observation tokens -> context tokens: two self-attention blocks with softmax-routed MoE."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(OBS_DIM, HIDDEN)
        self.layers = nn.ModuleList(
            Block(HIDDEN, MoE(HIDDEN, EXPERT_FFN, NUM_EXPERTS, TOP_K, "softmax", "index_add", shared=False))
            for _ in range(2)
        )
        self.norm = RMSNorm(HIDDEN)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        x = self.embed(observations)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Velocity(nn.Module):
    """Flow-matching action head: noisy actions + timestep embedding, cross-attends to the context."""

    def __init__(self):
        super().__init__()
        self.action_in = nn.Linear(ACTION_DIM, HIDDEN)
        self.time_mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, HIDDEN))
        self.block = Block(
            HIDDEN, MoE(HIDDEN, EXPERT_FFN, NUM_EXPERTS, TOP_K, "sigmoid", "index_put", shared=True)
        )
        self.norm = RMSNorm(HIDDEN)
        self.action_out = nn.Linear(HIDDEN, ACTION_DIM)

    def time_embedding(self, timestep: torch.Tensor) -> torch.Tensor:
        half = HIDDEN // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32) * (-math.log(10000.0) / half))
        angles = timestep.float().unsqueeze(-1) * freqs  # [1, half]
        return torch.cat([angles.sin(), angles.cos()], dim=-1).to(timestep.dtype)

    def forward(self, noisy_actions: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.action_in(noisy_actions) + self.time_mlp(self.time_embedding(timestep))
        x = self.block(x, memory=context)
        return self.action_out(self.norm(x))


class MoEPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = Decoder()
        self.velocity = Velocity()

    def forward(self, observations: torch.Tensor, noisy_actions: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return self.velocity(noisy_actions, timestep, self.decoder(observations))


def seeded(policy: nn.Module, seed: int = 0) -> nn.Module:
    """`policy` with seeded random weights (norms at one), bf16, in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if name.endswith("norm.weight"):
                continue  # norms start at one
            fan_in = param.shape[-1]
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
    return policy.to(DTYPE).eval()


def build_policy(seed: int = 0) -> MoEPolicy:
    """The policy with seeded random weights, bf16, in eval mode."""
    return seeded(MoEPolicy(), seed)


def example_inputs(num_tokens: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(observations [num_tokens, OBS_DIM], noisy_actions [HORIZON, ACTION_DIM], timestep [1]), bf16."""
    generator = torch.Generator().manual_seed(seed)
    observations = torch.randn(num_tokens, OBS_DIM, generator=generator).to(DTYPE)
    noisy_actions = torch.randn(HORIZON, ACTION_DIM, generator=generator).to(DTYPE)
    timestep = torch.rand(1, generator=generator).to(DTYPE)
    return observations, noisy_actions, timestep


def dynamic_shapes() -> dict[str, dict[int, torch.export.Dim] | None]:
    """torch.export spec: the number of observation tokens is dynamic (Dim "tokens")."""
    tokens = torch.export.Dim("tokens", min=MIN_TOKENS, max=MAX_TOKENS)
    return {"observations": {0: tokens}, "noisy_actions": None, "timestep": None}


def export_policy(seed: int = 0, num_tokens: int = 16) -> torch.export.ExportedProgram:
    """The policy exported with a dynamic token count."""
    policy = build_policy(seed)
    with torch.no_grad():
        return torch.export.export(policy, example_inputs(num_tokens, seed), dynamic_shapes=dynamic_shapes())
