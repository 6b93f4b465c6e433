"""INT4 experts (expert_precision = "int4"): the weights' quantization, their packed layout, and the math every
INT4 kernel computes (its reference).

Quantization (at export, from the weights themselves, no calibration data): symmetric, per group of
`group_size` consecutive elements along K (the inner dimension) of each weight row w[g, n, :]:

    scale[g, n, i] = bf16(amax |w[g, n, i*group : (i+1)*group]| / 7)   (1 where that rounds to 0)
    q[g, n, k]     = clamp(round_half_even(w[g, n, k] / scale[g, n, k // group]), -8, 7)
    w[g, n, k]    ~= q[g, n, k] * scale[g, n, k // group]

The dequantized value q * scale is exact in float32 (a 4-bit integer times a bf16), so the INT4 GEMM's
semantics are those of the part's GEMM with float32 weights q * scale: products accumulate in float32, the
output is rounded where the part's GEMM rounds it. Scales are bfloat16 whatever the part's dtype: half the
bytes of float32 (3% of the weights' bytes at group 128) and float32's exponent range, so no group's scale
underflows.

Packed layout (uint8 [G, N, Kp / 2], Kp = K rounded up to a multiple of 32): each weight row is cut into chunks
of 32 elements; chunk c of row n is 16 bytes, byte j of it holding q[n, 32c + j] + 8 in its low nibble and
q[n, 32c + 16 + j] + 8 in its high nibble (offset binary, as ExecuTorch's and vLLM's INT4 MoE kernels store
uint4 - 8). Why this layout, for the kernels (kernels/int4_tiles.py):
- one 16-byte vector load (one thread, one instruction) holds a whole 32-element chunk of one row, and every
  row starts 16-byte aligned whatever K is (rows are padded to Kp with zeros, q = 0);
- unpacking a byte is one AND (low nibble) or one shift (high nibble), and the chunk's low nibbles multiply
  the 16 activations k = 32c .. 32c + 15, its high nibbles the next 16: two contiguous runs of the activations,
  no stride-2 gather and no interleave of the unpacked values (the peers' byte of k = 2i, 2i + 1 needs one or
  the other); the tensor-core kernels take the two runs as two dots of K = 16 (mma's k-step);
- a chunk lies in one group for every group size (32, 64, 128), so each chunk's sum is scaled once, in float32.
Scales are bfloat16 [G, N, ceil(K / group)], row-major (each row's groups contiguous, as the peers').
"""

from __future__ import annotations

import dataclasses

import torch

from et_trt_backend import moe_experts

GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 128
CHUNK = 32  # elements of K per 16-byte chunk of a packed row; rows are padded to a multiple of it
SCALE_DTYPE = torch.bfloat16
Q_MIN, Q_MAX = -8, 7
_OFFSET = 8  # stored nibble = q + 8


def padded_k(k: int) -> int:
    """Kp: K rounded up to a multiple of CHUNK, the elements a packed row holds."""
    return -(-k // CHUNK) * CHUNK


def scale_groups(k: int, group_size: int) -> int:
    """How many scales one row of K elements has."""
    return -(-k // group_size)


def check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {GROUP_SIZES}, got {group_size!r}")


@dataclasses.dataclass(frozen=True)
class Int4Weights:
    """Quantized weights of logical shape [G, N, K]: packed uint8 [G, N, Kp / 2], scales bf16 [G, N, ceil(K/group)]."""

    packed: torch.Tensor
    scales: torch.Tensor
    k: int
    group_size: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


def pack(q: torch.Tensor) -> torch.Tensor:
    """uint8 [..., Kp / 2] of integer values q [..., K] in [-8, 7], in the module docstring's layout."""
    k = q.shape[-1]
    stored = torch.full((*q.shape[:-1], padded_k(k)), _OFFSET, dtype=torch.uint8, device=q.device)
    stored[..., :k] = (q.to(torch.int16) + _OFFSET).to(torch.uint8)
    chunks = stored.view(*q.shape[:-1], -1, 2, CHUNK // 2)  # [..., chunk, low/high half, 16]
    return (chunks[..., 0, :] | (chunks[..., 1, :] << 4)).reshape(*q.shape[:-1], -1)


def unpack(packed: torch.Tensor, k: int) -> torch.Tensor:
    """int8 q [..., K] of packed bytes [..., Kp / 2] (pack's inverse)."""
    if packed.dtype not in (torch.uint8, torch.int8) or packed.shape[-1] != padded_k(k) // 2:
        raise ValueError(f"packed INT4 rows of K = {k} are uint8 [..., {padded_k(k) // 2}]; got {packed.dtype} "
                         f"{list(packed.shape)}")
    b = packed.view(torch.uint8).to(torch.int16).view(*packed.shape[:-1], -1, CHUNK // 2)
    halves = torch.stack((b & 0xF, b >> 4), dim=-2)  # [..., chunk, low/high half, 16]
    return (halves.reshape(*packed.shape[:-1], -1)[..., :k] - _OFFSET).to(torch.int8)


def quantize(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> Int4Weights:
    """The INT4 form of weights w [G, N, K] (any float dtype), per the module docstring.

    Weights with inf or NaN have no INT4 form: refused (ValueError), as their group's scale would be too."""
    check_group_size(group_size)
    if w.dim() != 3 or not w.dtype.is_floating_point:
        raise ValueError(f"INT4 weights are floating [G, N, K] (groups, output features, inner dimension); got "
                         f"{w.dtype} {list(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("the weights hold inf or NaN, which INT4 with per-group scales cannot represent; keep "
                         "these experts in the part's precision (leave expert_precision unset) or fix the weights")
    groups, n, k = w.shape
    ng = scale_groups(k, group_size)
    w32 = torch.zeros(groups, n, ng * group_size, dtype=torch.float32, device=w.device)
    w32[..., :k] = w.detach().float()
    blocks = w32.view(groups, n, ng, group_size)
    scale = (blocks.abs().amax(dim=-1) / Q_MAX).to(SCALE_DTYPE)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / scale.float().unsqueeze(-1)).clamp(Q_MIN, Q_MAX).view(groups, n, -1)[..., :k]
    return Int4Weights(pack(q.to(torch.int8)), scale, k, group_size)


def check(packed: torch.Tensor, scales: torch.Tensor, k: int, group_size: int) -> tuple[int, int]:
    """(G, N) of a valid INT4 form of [G, N, K] weights; a ValueError naming what is wrong otherwise."""
    check_group_size(group_size)
    if packed.dim() != 3 or packed.dtype not in (torch.uint8, torch.int8) or packed.shape[2] != padded_k(k) // 2:
        raise ValueError(f"INT4 weights of K = {k} are packed uint8 (or int8) [G, N, {padded_k(k) // 2}]; got "
                         f"{packed.dtype} {list(packed.shape)}")
    groups, n, _ = packed.shape
    if scales.dtype != SCALE_DTYPE or tuple(scales.shape) != (groups, n, scale_groups(k, group_size)):
        raise ValueError(f"INT4 scales of weights {list(packed.shape)} at group {group_size} are bfloat16 "
                         f"[{groups}, {n}, {scale_groups(k, group_size)}]; got {scales.dtype} {list(scales.shape)}")
    return groups, n


def dequantize(packed: torch.Tensor, scales: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """float32 weights [G, N, K] = q * scale: exact, what every INT4 kernel multiplies by."""
    check(packed, scales, k, group_size)
    q = unpack(packed, k).float()
    return q * scales.float().repeat_interleave(group_size, dim=-1)[..., :k]


def grouped_mm_reference(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor,
                         group_size: int) -> torch.Tensor:
    """float32 [rows, N]: GroupedMM of a [rows, K] with the INT4 weights [G, N, K] (trans_b), groups as GroupedMM's
    (start_0 = 0, end_g = clamp(offs[g], start_g, rows); rows no group covers are zero; any offs is safe)."""
    rows, k = a.shape
    groups, n = check(packed, scales, k, group_size)
    if tuple(offs.shape) != (groups,):
        raise ValueError(f"offs must be [G] = [{groups}]; got {list(offs.shape)}")
    w = dequantize(packed, scales, k, group_size).to(a.device)
    x = a.detach().float()
    out = torch.zeros(rows, n, dtype=torch.float32, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        end = min(max(int(end), start), rows)
        if end > start:
            out[start:end] = x[start:end] @ w[g].T
        start = end
    return out


def check_moe_experts(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      w_gate_up: torch.Tensor, w_gate_up_scale: torch.Tensor, w_down: torch.Tensor,
                      w_down_scale: torch.Tensor, b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None,
                      activation: str, gate_up_layout: str, group_size: int) -> tuple[int, int, int, int, int]:
    """(T, k, E, H, F) of the MoEExperts op's inputs with INT4 weights (w_gate_up packed [E, N1, Hp / 2] with scales
    [E, N1, ceil(H / group)], w_down packed [E, H, Fp / 2] with scales [E, H, ceil(F / group)]; N1 = 2F for gated
    activations, else F; the other inputs as moe_experts.check_inputs says); a ValueError naming the input otherwise."""
    size = hidden.shape[-1]
    try:
        experts, rows = check(w_gate_up, w_gate_up_scale, size, group_size)
    except ValueError as e:
        raise ValueError(f"moe_experts: w_gate_up / w_gate_up_scale: {e}") from None
    gated = moe_experts.is_gated(activation)
    if gated and rows % 2:
        raise ValueError(f"moe_experts: {activation} takes 2F gate+up rows; w_gate_up has {rows}")
    ffn = rows // 2 if gated else rows
    try:
        down = check(w_down, w_down_scale, ffn, group_size)
    except ValueError as e:
        raise ValueError(f"moe_experts: w_down / w_down_scale (F = {ffn}): {e}") from None
    if down != (experts, size):
        raise ValueError(f"moe_experts: w_down must hold [E, H] = [{experts}, {size}] rows; got {list(down)}")
    # The other inputs' rules are the dense op's: its check, with shape-only stand-ins of the weights.
    stand_ins = (torch.empty((experts, rows, size), dtype=hidden.dtype, device="meta"),
                 torch.empty((experts, size, ffn), dtype=hidden.dtype, device="meta"))
    return moe_experts.check_inputs(hidden, topk_ids, topk_weights, *stand_ins, b_gate_up, b_down, activation,
                                    gate_up_layout)


def moe_experts_reference(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                          w_gate_up: torch.Tensor, w_gate_up_scale: torch.Tensor, w_down: torch.Tensor,
                          w_down_scale: torch.Tensor, b_gate_up: torch.Tensor | None = None,
                          b_down: torch.Tensor | None = None, *, group_size: int = DEFAULT_GROUP_SIZE,
                          activation: str = "swiglu", gate_up_layout: str = "concat", alpha: float | None = None,
                          limit: float | None = None) -> torch.Tensor:
    """The MoEExperts op with INT4 expert weights (moe_experts.reference's semantics, weights q * scale in float32)."""
    *_, size, ffn = check_moe_experts(hidden, topk_ids, topk_weights, w_gate_up, w_gate_up_scale, w_down,
                                      w_down_scale, b_gate_up, b_down, activation, gate_up_layout, group_size)
    return moe_experts.compute(
        hidden, topk_ids, topk_weights, dequantize(w_gate_up, w_gate_up_scale, size, group_size),
        dequantize(w_down, w_down_scale, ffn, group_size), b_gate_up, b_down, activation=activation,
        gate_up_layout=gate_up_layout, alpha=moe_experts.GPTOSS_ALPHA if alpha is None else alpha,
        limit=moe_experts.GPTOSS_LIMIT if limit is None else limit)
