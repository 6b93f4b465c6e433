"""A small vision-language-action (VLA) policy exported as two programs of one .pte: `prefix` and `denoise_step`.

Shaped like pi0 and SmolVLA, tiny and with random (seeded) weights:

    context  = prefix(image, prompt)                             # once per observation
    velocity = denoise_step(noisy_actions, timestep, context)    # num_steps times per observation

- prefix: a patch-convolution vision encoder (a Conv2d whose stride is its
  kernel, as SigLIP's patch embedding is) turns the camera image into patch
  tokens, the prompt's token ids are embedded, and the transformer `backbone`
  (attention + a top-k MoE FFN per layer, moe_policy.py's blocks) encodes both:
  the context, as many rows as patches + prompt tokens (the prompt length is
  the Dim "prompt").
- denoise_step: the flow-matching action head. The timestep's sinusoidal
  embedding is computed in float64, as pi0's `create_sinusoidal_pos_embedding`
  does, then cast to the model's dtype; the action tokens run through the same
  `backbone` layers, attending to the context (its length the Dim "context"),
  and a linear layer gives the velocity.

The backbone's weights serve both programs, so the .pte stores them once.
`export_programs` is what `et-trt export --module examples/vla_policy.py:export_programs`
calls; examples/vla_recipe.toml is its two-program recipe.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from moe_policy import DTYPE, Block, MoE, RMSNorm, seeded

IMAGE_SIZE = 32
PATCH = 8
PATCHES = (IMAGE_SIZE // PATCH) ** 2
VOCAB = 128
HIDDEN = 64
EXPERT_FFN = 64
NUM_EXPERTS = 8
TOP_K = 2
LAYERS = 1
ACTION_DIM = 8
HORIZON = 8
MAX_PROMPT = 48
MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # pi0's defaults


def sinusoidal_embedding(timestep: torch.Tensor, dimension: int) -> torch.Tensor:
    """[batch] -> [batch, dimension]: sin and cos of 2 pi t / period, periods spaced geometrically from
    MIN_PERIOD to MAX_PERIOD, computed in float64 as pi0 computes them."""
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=torch.float64)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    angles = (2 * math.pi / period)[None, :] * timestep[:, None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class VisionEncoder(nn.Module):
    """Image [3, H, W] -> patch tokens [PATCHES, HIDDEN]: one convolution per patch, then a position embedding."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, HIDDEN, kernel_size=PATCH, stride=PATCH)
        self.position = nn.Parameter(torch.empty(PATCHES, HIDDEN))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        patches = self.patch(image.unsqueeze(0)).flatten(2)  # [1, HIDDEN, PATCHES]
        return patches[0].transpose(0, 1) + self.position


def _backbone_layer() -> Block:
    return Block(HIDDEN, MoE(HIDDEN, EXPERT_FFN, NUM_EXPERTS, TOP_K, "softmax", "index_add", shared=False))


class VLAPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.vision = VisionEncoder()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.backbone = nn.ModuleList(_backbone_layer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.action_in = nn.Linear(ACTION_DIM, HIDDEN)
        self.time_mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, HIDDEN))
        self.action_out = nn.Linear(HIDDEN, ACTION_DIM)

    def prefix(self, image: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """Image [3, H, W] and prompt token ids [prompt] -> context [PATCHES + prompt, HIDDEN]."""
        x = torch.cat([self.vision(image), self.embed(prompt)], dim=0)
        for layer in self.backbone:
            x = layer(x)
        return self.norm(x)

    def denoise_step(self, noisy_actions: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Noisy actions [HORIZON, ACTION_DIM], timestep [1] (float32), context -> velocity [HORIZON, ACTION_DIM]."""
        time = sinusoidal_embedding(timestep, HIDDEN).to(noisy_actions.dtype)
        x = self.action_in(noisy_actions) + self.time_mlp(time)
        for layer in self.backbone:
            x = layer(x, memory=context)
        return self.action_out(self.norm(x))


def build_policy(seed: int = 0) -> VLAPolicy:
    """The policy with seeded random weights, bf16, in eval mode."""
    return seeded(VLAPolicy(), seed)


def example_inputs(prompt_tokens: int = 12, seed: int = 0) -> dict[str, tuple[torch.Tensor, ...]]:
    """Inputs of each program, by name: prefix (image, prompt ids), denoise_step (noisy actions, timestep,
    context of PATCHES + prompt_tokens rows)."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.rand(3, IMAGE_SIZE, IMAGE_SIZE, generator=generator).to(DTYPE)
    prompt = torch.randint(0, VOCAB, (prompt_tokens,), generator=generator)
    noisy_actions = torch.randn(HORIZON, ACTION_DIM, generator=generator).to(DTYPE)
    timestep = torch.rand(1, generator=generator)
    context = torch.randn(PATCHES + prompt_tokens, HIDDEN, generator=generator).to(DTYPE)
    return {"prefix": (image, prompt), "denoise_step": (noisy_actions, timestep, context)}


def dynamic_shapes() -> dict[str, tuple]:
    """torch.export specs: the prompt length (Dim "prompt") and the context length (Dim "context")."""
    prompt = torch.export.Dim("prompt", min=1, max=MAX_PROMPT)
    context = torch.export.Dim("context", min=PATCHES + 1, max=PATCHES + MAX_PROMPT)
    return {"prefix": ({}, {0: prompt}), "denoise_step": ({}, {}, {0: context})}


def export_method(policy: VLAPolicy, method: str, inputs: tuple, dynamic_shapes: tuple):
    """One method of the policy as a program: torch.export exports `forward`, so the method stands in for it
    (the module paths stay the policy's: "vision.patch", "backbone.0.moe")."""
    policy.forward = getattr(policy, method)
    try:
        with torch.no_grad():
            return torch.export.export(policy, inputs, dynamic_shapes=dynamic_shapes)
    finally:
        del policy.forward


def export_programs(seed: int = 0) -> dict[str, torch.export.ExportedProgram]:
    """Both programs, by method name, exported from one policy (so they share its weights)."""
    policy = build_policy(seed)
    inputs, shapes = example_inputs(seed=seed), dynamic_shapes()
    return {name: export_method(policy, name, inputs[name], shapes[name]) for name in ("prefix", "denoise_step")}
