"""Reusable MoE test models, written the way public MoE code writes its torch._grouped_mm path.

- `GroupedMoE`: one configurable MoE block (router scoring, top-k, group-limited
  routing, counting and sorting style, combine style, shared expert).
- `RoutingMoE`: the bare routing and expert path (top-k, sort, histc, cumsum, two
  `_grouped_mm`, combine by index_add or by inverse permutation), 32 wide.
- `MoEStack`: several MoE blocks with an op between them that TensorRT does not
  lower, to show how partitions split around it.
- `hf_moe_block`, `HFDecoderLayer`, `HFCausalLM`: an unmodified sparse-MoE block,
  decoder layer or whole causal LM from `transformers`, built from a tiny random
  config with the "grouped_mm" experts implementation.
- `TokenTypeMoE`, `ActionTokenMoE`: experts chosen by a token-type input or a
  comparison (WALL-OSS's mixture of transformers), one nn.Linear MLP per expert.
- `edge_program`: the edge program a partitioner sees inside
  to_edge_transform_and_lower, for tests that inspect partitioning without
  lowering.

The grouped-GEMM models are bf16: torch.export accepts `_grouped_mm` only in bf16.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

DTYPE = torch.bfloat16


class GroupedMoE(nn.Module):
    """A MoE FFN block with grouped GEMM experts.

    scoring: "softmax" | "sigmoid"          (sigmoid renormalises the top-k weights)
    groups: (n_group, topk_group) | None   DeepSeek-V3 style group-limited routing
    counts: "histc" | "one_hot" | "bincount"  tokens per expert
    sort: "argsort_stable" | "sort" | "sort_stable"
    combine: "index_put" | "index_add" | "index_add_int32" (its token index cast to int32) | "scatter_add"
    shared: add a dense shared expert (DeepSeek/Qwen style)
    """

    def __init__(
        self,
        hidden: int = 32,
        ffn: int = 32,
        experts: int = 4,
        top_k: int = 2,
        scoring: str = "softmax",
        groups: tuple[int, int] | None = None,
        counts: str = "histc",
        sort: str = "argsort_stable",
        combine: str = "index_put",
        shared: bool = False,
    ):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * ffn, hidden) / math.sqrt(hidden))
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, ffn) / math.sqrt(ffn))
        self.shared_expert = nn.Sequential(nn.Linear(hidden, ffn), nn.SiLU(), nn.Linear(ffn, hidden)) if shared else None
        self.experts, self.top_k, self.scoring, self.groups = experts, top_k, scoring, groups
        self.counts, self.sort, self.combine = counts, sort, combine

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x).float()
        scores = logits.softmax(-1) if self.scoring == "softmax" else logits.sigmoid()
        choice = scores
        if self.groups is not None:
            n_group, topk_group = self.groups
            group_scores = choice.view(-1, n_group, self.experts // n_group).topk(2, dim=-1)[0].sum(-1)
            group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, self.experts // n_group).reshape(-1, self.experts)
            choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        if self.top_k == 1 and self.groups is None:
            weights, ids = choice.max(dim=-1, keepdim=True)  # top-1 routers often use max
        else:
            ids = torch.topk(choice, self.top_k, dim=-1)[1]
            weights = scores.gather(1, ids)
        if self.scoring == "sigmoid":
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights.to(x.dtype), ids

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weights, ids = self.route(x)
        flat = ids.reshape(-1)
        if self.sort == "argsort_stable":
            order = torch.argsort(flat, stable=True)
        elif self.sort == "sort_stable":
            order = torch.sort(flat, stable=True)[1]
        else:
            order = torch.sort(flat)[1]
        if self.counts == "histc":
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        elif self.counts == "bincount":
            counts = torch.bincount(flat, minlength=self.experts)
        else:
            counts = F.one_hot(flat, self.experts).sum(0)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        token = order // self.top_k
        rows = x[token]
        gate, up = torch._grouped_mm(rows, self.gate_up_proj.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
        rows = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1)
        if self.combine == "index_add":
            out = torch.zeros_like(x).index_add_(0, token, rows)
        elif self.combine == "index_add_int32":
            out = torch.zeros_like(x).index_add_(0, token.to(torch.int32), rows)
        elif self.combine == "scatter_add":
            out = torch.zeros_like(x).scatter_add(0, token.unsqueeze(-1).expand(-1, x.shape[-1]), rows)
        else:
            unsorted = torch.empty_like(rows)
            unsorted[order] = rows
            out = unsorted.view(-1, self.top_k, x.shape[-1]).sum(1)
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out.reshape(shape)


def unsupported_identity(x: torch.Tensor) -> torch.Tensor:
    """x through masked_scatter with an empty mask (x != x: no element of x is NaN): core ATen with a portable
    kernel but no TensorRT lowering in op_support, so it stays in ExecuTorch (the tests' unsupported op)."""
    return x.masked_scatter(x != x, x)


class MoEStack(nn.Module):
    """Norm -> MoE -> an unsupported op -> MoE: two MoE blocks that cannot share an engine."""

    def __init__(self, hidden: int = 32, **moe_kwargs):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.moe0 = GroupedMoE(hidden, **moe_kwargs)
        self.moe1 = GroupedMoE(hidden, **moe_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.moe0(self.norm(x))
        x = unsupported_identity(x)
        return x + self.moe1(x)


class MoEWithUnsupportedOp(GroupedMoE):
    """A MoE block whose router computes in float64, a dtype TensorRT does not have (unsupported where the
    recipe's truncate_double is off)."""

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = super().route(x)
        return (weights.double() * 2.0).to(x.dtype), ids  # the offending line


class RoutingMoE(torch.nn.Module):
    """Public-code MoE routing: top-k -> argsort/sort -> histc -> cumsum -> _grouped_mm -> combine."""

    def __init__(self, combine: str, dim=32, ffn=32, experts=8, k=2):
        super().__init__()
        self.k, self.experts, self.combine = k, experts, combine
        self.router = torch.nn.Linear(dim, experts, bias=False, dtype=torch.bfloat16)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * ffn, dim, dtype=torch.bfloat16) / dim**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, ffn, dim, dtype=torch.bfloat16) / ffn**0.5)

    def forward(self, x):
        weights, ids = torch.topk(torch.softmax(self.router(x).float(), -1), self.k, dim=-1)
        flat = ids.reshape(-1)
        if self.combine == "index_add":  # torchtitan style
            order = torch.argsort(flat, stable=True)
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        else:  # transformers style: unstable sort, inverse permutation, reshape-and-sum
            _, order = torch.sort(flat)
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = x[order // self.k]
        gate, up = torch._grouped_mm(rows, self.gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        rows = torch._grouped_mm(F.silu(gate) * up, self.down, offs=offs)  # down stored [E, ffn, dim]
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1).to(rows.dtype)
        if self.combine == "index_add":
            return torch.zeros_like(x).index_add(0, order // self.k, rows)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0])
        return rows[inverse].view(x.shape[0], self.k, -1).sum(1)


def bf16(module: nn.Module, seed: int = 0) -> nn.Module:
    """`module` with seeded random weights, in bf16 and eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return module.to(DTYPE).eval()


def export(module: nn.Module, tokens: int = 6, hidden: int = 32, dynamic: bool = True, batch: bool = False):
    """torch.export of `module` on [tokens, hidden] (or [1, tokens, hidden]) bf16 input."""
    shape = (1, tokens, hidden) if batch else (tokens, hidden)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(DTYPE)
    dims = None
    if dynamic:
        dims = ({1 if batch else 0: torch.export.Dim("tokens", min=2, max=256)},)
    with torch.no_grad():
        return torch.export.export(module, (x,), dynamic_shapes=dims)


# ---- transformers models -----------------------------------------------------
HF_HIDDEN = 32
HF_VOCAB = 64


# name -> (module under transformers.models, class-name prefix, MoE block class, family-specific config).
# Every family uses the "grouped_mm" experts implementation (transformers.integrations.moe).
HF_FAMILIES = {
    # softmax top-k router
    "mixtral": ("mixtral", "Mixtral", "MixtralSparseMoeBlock", dict(intermediate_size=32, num_local_experts=4)),
    # shared expert with a sigmoid gate
    "qwen2_moe": ("qwen2_moe", "Qwen2Moe", "Qwen2MoeSparseMoeBlock",
                  dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=32,
                       num_experts=4)),
    # query/key norms per head
    "qwen3_moe": ("qwen3_moe", "Qwen3Moe", "Qwen3MoeSparseMoeBlock",
                  dict(moe_intermediate_size=32, intermediate_size=32, num_experts=8)),
    # query/key norms over all heads
    "olmoe": ("olmoe", "Olmoe", "OlmoeSparseMoeBlock", dict(intermediate_size=32, num_experts=4)),
    # "sparse mixer" router: expert ids are two max results concatenated
    "phimoe": ("phimoe", "Phimoe", "PhimoeSparseMoeBlock", dict(intermediate_size=32, num_local_experts=4)),
    # sigmoid router with group-limited routing, shared experts, multi-head latent attention (a key per
    # query head: its expand_kv makes one, so num_key_value_heads = num_attention_heads)
    "deepseek_v3": ("deepseek_v3", "DeepseekV3", "DeepseekV3MoE",
                    dict(moe_intermediate_size=32, intermediate_size=32, n_routed_experts=8, n_group=4,
                         topk_group=2, n_shared_experts=1, first_k_dense_replace=0, q_lora_rank=16, num_key_value_heads=4,
                         kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
    # scaled embeddings, residuals and logits
    "granitemoe": ("granitemoe", "GraniteMoe", "GraniteMoeMoE", dict(intermediate_size=32, num_local_experts=4)),
    # transposed biased experts, attention sinks, a sliding window shorter than the test's tokens
    "gpt_oss": ("gpt_oss", "GptOss", "GptOssMLP",
                dict(intermediate_size=32, num_local_experts=4, layer_types=["sliding_attention"], sliding_window=4,
                     attn_implementation="eager")),  # GptOss has no sdpa attention
}


# Families whose whole models need issue 34/35's work (test_transformers_heldout.py exports each whole, once):
HELD_OUT_FAMILIES = {
    # rotary embedding in complex numbers (polar, view_as_complex, a complex product), multi-head latent attention
    "deepseek_v2": ("deepseek_v2", "DeepseekV2", "DeepseekV2Moe",
                    dict(moe_intermediate_size=32, intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
                         first_k_dense_replace=0, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4)),
    # the text model of a VLM: interleaved multimodal rotary sections written with step-3 slices
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeText", "Qwen3VLMoeTextSparseMoeBlock",
                     dict(moe_intermediate_size=32, intermediate_size=32, num_experts=4, head_dim=16,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                           "mrope_interleaved": True})),
    # mamba2 layers (depthwise conv1d, softplus, chunked scan over a padded token count) beside attention
    "granitemoehybrid": ("granitemoehybrid", "GraniteMoeHybrid", "GraniteMoeHybridMoE",
                         dict(intermediate_size=32, num_local_experts=4, shared_intermediate_size=32,
                              num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_heads=4,
                              mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8, mamba_n_groups=1,
                              position_embedding_type="rope")),
    # gated delta-net layers (conv1d, l2 norms, a chunked delta rule with torch.eye) beside gated attention
    "qwen3_next": ("qwen3_next", "Qwen3Next", "Qwen3NextSparseMoeBlock",
                   dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=32,
                        num_experts=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                        linear_num_value_heads=4, num_hidden_layers=2,
                        layer_types=["linear_attention", "full_attention"])),
}


def _hf_family(name: str):
    """(modeling module, class-name prefix, MoE block class name, config) of a transformers MoE family."""
    import importlib

    families = {**HF_FAMILIES, **HELD_OUT_FAMILIES}
    if name not in families:
        raise ValueError(f"unknown transformers MoE family {name!r}; known: {sorted(families)}")
    module, prefix, block, extra = families[name]
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return modeling, prefix, block, extra


def hf_config(name: str, top_k: int = 2):
    """A tiny config of one transformers MoE family: one layer, hidden 32, 4 query / 2 key-value heads."""
    modeling, prefix, _, extra = _hf_family(name)
    common = dict(
        hidden_size=HF_HIDDEN, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=1,
        vocab_size=HF_VOCAB, max_position_embeddings=512, num_experts_per_tok=top_k,
        experts_implementation="grouped_mm", attn_implementation="sdpa", use_cache=False,
    )
    return getattr(modeling, f"{prefix}Config")(**{**common, **extra})


def hf_moe_block(name: str, top_k: int = 2) -> nn.Module:
    """An unmodified transformers sparse-MoE block from a tiny random config (grouped_mm experts)."""
    modeling, _, block, _ = _hf_family(name)
    return bf16(getattr(modeling, block)(hf_config(name, top_k)))


class HFDecoderLayer(nn.Module):
    """One unmodified transformers decoder layer (attention + MoE) with its rotary embedding:
    hidden states [1, tokens, hidden] in, out."""

    def __init__(self, name: str):
        super().__init__()
        modeling, prefix, _, _ = _hf_family(name)
        config = hf_config(name)
        self.rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(config)
        self.layer = getattr(modeling, f"{prefix}DecoderLayer")(config, 0)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(hidden_states.shape[1]).unsqueeze(0)
        out = self.layer(hidden_states, attention_mask=None, position_ids=positions,
                         position_embeddings=self.rotary(hidden_states, positions))
        return out[0] if isinstance(out, tuple) else out


class HFCausalLM(nn.Module):
    """A whole unmodified transformers *ForCausalLM (embeddings, rotary, attention, MoE, norms, head):
    token ids [1, tokens] in, logits out; for a family without one (a VLM's text model), its *Model: token
    ids in, last hidden states out."""

    def __init__(self, name: str):
        super().__init__()
        modeling, prefix, _, _ = _hf_family(name)
        model = getattr(modeling, f"{prefix}ForCausalLM", None) or getattr(modeling, f"{prefix}Model")
        self.model = model(hf_config(name))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


# ---- partitioning without lowering --------------------------------------------
def edge_program(exported, partitioner):
    """The edge program `partitioner` receives inside to_edge_transform_and_lower (no lowering).

    Uses ExecuTorch's own step that prepares it (pre-decomposition transforms,
    decompositions with the partitioner's preserved ops), so tests see exactly
    what partition() sees.
    """
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.program._program import _gen_edge_manager_for_partitioners

    manager = _gen_edge_manager_for_partitioners(
        {"forward": [partitioner]}, {"forward": exported}, EdgeCompileConfig(), None
    )
    return manager.exported_program()


class MoEWithDetour(nn.Module):
    """A MoE block whose routing weights take a detour through a module outside it, with an unsupported op."""

    def __init__(self, **moe_kwargs):
        super().__init__()
        self.outsider = _Outsider()
        self.moe = _DetourMoE(**moe_kwargs)
        object.__setattr__(self.moe, "detour", self.outsider)  # called by moe, owned by the parent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x)


class _DetourMoE(GroupedMoE):
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = super().route(x)
        return self.detour(weights), ids


class _Outsider(nn.Module):
    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        return unsupported_identity(weights)


# ---- experts routed by an input (mixture of transformers) ----------------------
class _ExpertMLP(nn.Module):
    """One expert: a gated MLP of its own width (WALL-OSS's BlockSparseMLP)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TokenTypeMoE(nn.Module):
    """Experts chosen per token by a token-type tensor, written as WALL-OSS writes its SparseMoeBlock
    (lerobot 0.4.4, policies/wall_x/qwen_model/qwen2_5_vl_moe.py): expert i runs on the tokens whose type
    is i, on their first dim_inputs[i] features, and writes back there. `skip_empty` keeps the authors'
    `if mask.sum() == 0: continue`, a Python branch on data that torch.export refuses; without it (the
    smallest rewrite: those two lines deleted) the block exports and computes the same."""

    def __init__(self, dim_inputs=(32, 16), ffns=(48, 24), skip_empty: bool = False):
        super().__init__()
        self.experts = nn.ModuleList(_ExpertMLP(dim, ffn) for dim, ffn in zip(dim_inputs, ffns))
        self.dim_inputs = dim_inputs
        self.skip_empty = skip_empty

    def forward(self, hidden_states: torch.Tensor, experts_indices: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(hidden_states)
        for expert_idx, expert in enumerate(self.experts):
            mask = experts_indices == expert_idx
            if self.skip_empty and mask.sum() == 0:
                continue
            dim_input = self.dim_inputs[expert_idx]
            selected_hidden = hidden_states[mask]
            processed_hidden = expert(selected_hidden[:, :dim_input])
            batch_indices, seq_indices = torch.where(mask)
            output[batch_indices, seq_indices, :dim_input] = processed_hidden
        return output


class ActionTokenMoE(nn.Module):
    """The token types as WALL-OSS computes them from the prompt: a comparison with the action token id."""

    ACTION_TOKEN = 7

    def __init__(self):
        super().__init__()
        self.moe = TokenTypeMoE()

    def forward(self, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.moe(hidden_states, input_ids == self.ACTION_TOKEN)
