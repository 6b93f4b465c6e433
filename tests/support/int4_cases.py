"""Inputs of the INT4 expert kernels' checks (CPU interpreter, GPU tests, benchmarks): random activations, routing
and weights, the weights quantized by et_trt_backend.int4_weights."""

from __future__ import annotations

import dataclasses
import math

import torch

from et_trt_backend import int4_weights, moe_experts


@dataclasses.dataclass
class MoECase:
    """The MoEExperts op's inputs with INT4 expert weights (int4_weights.moe_experts_reference's arguments)."""

    hidden: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    gate_up: int4_weights.Int4Weights
    down: int4_weights.Int4Weights
    b_gate_up: torch.Tensor | None
    b_down: torch.Tensor | None
    activation: str
    layout: str
    dense_gate_up: torch.Tensor  # the weights before quantization, in hidden's dtype
    dense_down: torch.Tensor

    @property
    def group_size(self) -> int:
        return self.gate_up.group_size

    def reference(self) -> torch.Tensor:
        return int4_weights.moe_experts_reference(
            self.hidden, self.ids, self.weights, self.gate_up.packed, self.gate_up.scales, self.down.packed,
            self.down.scales, self.b_gate_up, self.b_down, group_size=self.group_size, activation=self.activation,
            gate_up_layout=self.layout)

    def to(self, device) -> "MoECase":
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
            elif isinstance(value, int4_weights.Int4Weights):
                moved[name] = dataclasses.replace(value, packed=value.packed.to(device), scales=value.scales.to(device))
        return MoECase(**moved)


def routing(tokens: int, top_k: int, experts: int, generator: torch.Generator, invalid: float = 0.0) -> torch.Tensor:
    """int32 [T, k] distinct experts per token; `invalid` of them replaced by ids outside [0, E)."""
    if tokens == 0:
        return torch.zeros(0, top_k, dtype=torch.int32)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    bad = torch.rand(ids.shape, generator=generator) < invalid
    wild = torch.where(torch.rand(ids.shape, generator=generator) < 0.5, -1 - ids, experts + ids)
    return torch.where(bad, wild, ids).to(torch.int32)


def moe_case(tokens: int, top_k: int, experts: int, hidden: int, ffn: int, *, activation: str = "swiglu",
             layout: str = "concat", group_size: int = int4_weights.DEFAULT_GROUP_SIZE, dtype=torch.bfloat16,
             bias: bool = False, weights_dtype=torch.float32, invalid: float = 0.0, seed: int = 0) -> MoECase:
    g = torch.Generator().manual_seed(seed)
    rows = 2 * ffn if moe_experts.is_gated(activation) else ffn
    dense_gate_up = (torch.randn(experts, rows, hidden, generator=g) / math.sqrt(hidden)).to(dtype)
    dense_down = (torch.randn(experts, hidden, ffn, generator=g) / math.sqrt(ffn)).to(dtype)
    return MoECase(
        hidden=torch.randn(tokens, hidden, generator=g).to(dtype),
        ids=routing(tokens, top_k, experts, g, invalid),
        weights=torch.rand(tokens, top_k, generator=g).to(weights_dtype),
        gate_up=int4_weights.quantize(dense_gate_up, group_size),
        down=int4_weights.quantize(dense_down, group_size),
        b_gate_up=(torch.randn(experts, rows, generator=g) * 0.1).to(dtype) if bias else None,
        b_down=(torch.randn(experts, hidden, generator=g) * 0.1).to(dtype) if bias else None,
        activation=activation, layout=layout, dense_gate_up=dense_gate_up, dense_down=dense_down)


def grouped_case(rows: int, k: int, n: int, offs: list[int], *, group_size: int = int4_weights.DEFAULT_GROUP_SIZE,
                 dtype=torch.bfloat16, seed: int = 0):
    """(a [rows, K], INT4 weights of [G, N, K], offs int32): a GroupedMM with INT4 weights."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, k, generator=g).to(dtype)
    w = torch.randn(len(offs), n, k, generator=g) / math.sqrt(k)
    return a, int4_weights.quantize(w, group_size), torch.tensor(offs, dtype=torch.int32)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-wise: ||got - want|| / ||want|| in float64."""
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


def run_moe(launcher, case: MoECase, experts: int, spare_workspace: int = 0) -> tuple[torch.Tensor, str]:
    """`case` (on the GPU) through an INT4 MoEExpertsLauncher told `experts` experts, into a NaN-poisoned output and
    a 0xff workspace (`spare_workspace` bytes more than it needs); (out on the CPU, the kernels that ran)."""
    from et_trt_backend.kernels.launcher import moe_workspace_bytes
    from et_trt_backend.kernels.moe_op import launch_args

    tokens, size = case.hidden.shape
    top_k, ffn = case.ids.shape[1], case.dense_down.shape[2]
    device = case.hidden.device
    out = torch.full((tokens, size), float("nan"), dtype=case.hidden.dtype, device=device)
    workspace = torch.full((moe_workspace_bytes(tokens, top_k, experts, size, ffn) + spare_workspace,), 0xFF,
                           dtype=torch.uint8, device=device)
    launcher.launch(launch_args(
        case.hidden, case.ids, case.weights, case.gate_up.packed, case.down.packed, out, workspace, experts=experts,
        ffn=ffn, b_gate_up=case.b_gate_up, b_down=case.b_down, activation=case.activation,
        gate_up_layout=case.layout, w_gate_up_scale=case.gate_up.scales, w_down_scale=case.down.scales,
        group_size=case.group_size), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return out.cpu(), launcher.last_kernels
