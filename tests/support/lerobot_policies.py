"""LeRobot 0.4.4's own policy classes, built tiny from local configs (no hub), and the programs a deployer
exports from each: the prefix (VLM) pass and one denoising step for the VLAs, the inference forward for
ACT and Diffusion Policy.

LeRobot is installed by scripts/setup.sh with --no-deps (it pins torch < 2.11) beside what its policy
code imports (pyproject's [test] extra). Its policy code runs unmodified; what the harness changes, and
why, is said where it does it:
- torchvision from PyPI is a CUDA build whose compiled ops do not load beside CPU torch
  (tests/support/torchvision_cpu.py, run by conftest.py); ACT and Diffusion use only its pure-Python ResNet.
- transformers 5.24 (the project's pin; LeRobot 0.4.4 wants 4.57) breaks two package initializers that
  import policies we do not build (`_import_policy_modules`), and four transformers 4.x interfaces pi0
  uses (`_openpi_transformers`).
- Where a policy's inference is a Python loop around its networks (GR00T, XVLA, Diffusion Policy), the
  program is one step of that loop written with the policy's own modules in the policy's order; each
  says which lines of LeRobot it follows and why it is not the method itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch
from torch import nn

LEROBOT_VERSION = "0.4.4"
BATCH = 1
IMAGE = (3, 32, 32)  # channels, height, width: the tiniest image every vision tower here accepts
bf16 = torch.bfloat16


class Program(NamedTuple):
    module: nn.Module
    args: tuple


class Policy(NamedTuple):
    """What the test exports for one policy: its programs and the recipe they are lowered with."""
    programs: dict[str, Program]
    recipe: dict


def import_lerobot() -> None:
    """Makes LeRobot's policy modules importable (see the module docstring); skips where LeRobot is absent."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None:
        pytest.skip(f"needs lerobot {LEROBOT_VERSION} (scripts/setup.sh installs it with --no-deps)")
    from importlib.metadata import version
    if version("lerobot") != LEROBOT_VERSION:
        pytest.skip(f"these tiny configs are written for lerobot {LEROBOT_VERSION}, found {version('lerobot')}")
    _import_policy_modules()


def _import_policy_modules() -> None:
    """lerobot.policies' __init__ imports every policy's config, GR00T's package among them, and
    lerobot.policies.groot's __init__ imports GR00TN15, whose config class fails to define under
    transformers 5 (its @dataclass re-decorates a PreTrainedConfig subclass that transformers 5 already made
    a keyword-only dataclass: "non-default argument 'backbone_cfg' follows default argument"). These two
    packages are registered without running their __init__, so each policy module imports on its own."""
    for name in ("lerobot.policies", "lerobot.policies.groot"):
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules[name] = package


def _features(state: int, action: int, image: bool = True) -> dict:
    from lerobot.configs.types import FeatureType, PolicyFeature
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (state,))}
    if image:
        inputs["observation.images.top"] = PolicyFeature(FeatureType.VISUAL, IMAGE)
    return dict(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (action,))},
                device="cpu")


class _Method(nn.Module):
    """A module whose forward is one of the policy's own methods."""

    def __init__(self, owner: nn.Module, method: Callable):
        super().__init__()
        self.owner = owner
        self.method = method

    def forward(self, *args):
        return self.method(*args)


# ---- ACT ----------------------------------------------------------------------------------------------
def act() -> Policy:
    """ACTPolicy.predict_action_chunk (the inference forward; no VAE sampling in eval), ResNet-18 backbone."""
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    config = ACTConfig(**_features(state=4, action=4), chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2,
                       dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1,
                       pretrained_backbone_weights=None)
    policy = ACTPolicy(config).eval()
    batch = {"observation.state": torch.randn(BATCH, 4), "observation.images.top": torch.randn(BATCH, *IMAGE)}
    return Policy({"forward": Program(_Method(policy, policy.predict_action_chunk), (batch,))},
                  {"default": {"precision": "fp32"}})


# ---- Diffusion Policy -----------------------------------------------------------------------------------
class DiffusionGenerate(nn.Module):
    """DiffusionModel.generate_actions(batch, noise) with one change: its sampling loop
    (conditional_sample) walks the scheduler's timesteps as Python ints. LeRobot walks the timesteps
    tensor, so DDIM's step branches on a tensor (`prev_timestep >= 0`), which torch.export refuses as
    data-dependent; the lines are otherwise LeRobot's, calling its UNet, observation encoder and scheduler."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        model.noise_scheduler.set_timesteps(model.num_inference_steps)
        self.timesteps = [int(t) for t in model.noise_scheduler.timesteps]

    def forward(self, batch: dict, noise: torch.Tensor) -> torch.Tensor:
        model = self.model
        global_cond = model._prepare_global_conditioning(batch)
        sample = noise
        for t in self.timesteps:
            timestep = torch.full(sample.shape[:1], t, dtype=torch.long)
            model_output = model.unet(sample, timestep, global_cond=global_cond)
            sample = model.noise_scheduler.step(model_output, t, sample).prev_sample
        start = model.config.n_obs_steps - 1
        return sample[:, start:start + model.config.n_action_steps]


def diffusion() -> Policy:
    """The whole inference (observation encoder, two DDIM steps of the 1D UNet), GroupNorm ResNet-18."""
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    config = DiffusionConfig(**_features(state=4, action=4), n_obs_steps=2, horizon=8, n_action_steps=4,
                             drop_n_last_frames=3, crop_shape=None, spatial_softmax_num_keypoints=4,
                             down_dims=(16, 32), kernel_size=3, n_groups=4, diffusion_step_embed_dim=16,
                             noise_scheduler_type="DDIM", num_train_timesteps=10, num_inference_steps=2)
    policy = DiffusionPolicy(config).eval()
    batch = {"observation.state": torch.randn(BATCH, 2, 4), "observation.images": torch.randn(BATCH, 2, 1, *IMAGE)}
    return Policy({"forward": Program(DiffusionGenerate(policy.diffusion), (batch, torch.randn(BATCH, 8, 4)))},
                  {"default": {"precision": "fp32"}})


# ---- GR00T N1.5 action head --------------------------------------------------------------------------------
class GrootCondition(nn.Module):
    """The first lines of FlowmatchingActionHead.get_action: the backbone features through its LayerNorm
    and self-attention (process_backbone_output), and the state through the embodiment's state encoder."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, backbone_features, backbone_attention_mask, state, embodiment_id):
        from transformers.feature_extraction_utils import BatchFeature
        output = self.head.process_backbone_output(BatchFeature(data={
            "backbone_features": backbone_features, "backbone_attention_mask": backbone_attention_mask}))
        return output["backbone_features"], self.head.state_encoder(state, embodiment_id)


class GrootDenoiseStep(nn.Module):
    """The body of FlowmatchingActionHead.get_action's denoising loop (LeRobot writes it inline, not as a
    method): action encoder, position embedding, [state, future tokens, actions] through the DiT, action
    decoder; returns the predicted velocity (the host does the Euler update)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, vl_embs, state_features, actions, timesteps, embodiment_id):
        head = self.head
        action_features = head.action_encoder(actions, timesteps, embodiment_id)
        pos_ids = torch.arange(action_features.shape[1], dtype=torch.long)
        action_features = action_features + head.position_embedding(pos_ids).unsqueeze(0)
        future_tokens = head.future_tokens.weight.unsqueeze(0).expand(vl_embs.shape[0], -1, -1)
        sa_embs = torch.cat((state_features, future_tokens, action_features), dim=1)
        model_output = head.model(hidden_states=sa_embs, encoder_hidden_states=vl_embs, timestep=timesteps)
        return head.action_decoder(model_output, embodiment_id)[:, -head.action_horizon:]


def groot() -> Policy:
    """GR00T N1.5's FlowmatchingActionHead (DiT with cross-attention to the VLM features), bf16. Its Eagle
    VLM backbone is not built: GrootPolicy fetches it from the hub."""
    from lerobot.policies.groot.action_head.flow_matching_action_head import (
        FlowmatchingActionHead, FlowmatchingActionHeadConfig)
    width, vl_tokens, action_dim, horizon, state_dim = 32, 6, 4, 4, 6
    attention = dict(num_attention_heads=2, attention_head_dim=16, output_dim=width, dropout=0.0, final_dropout=False,
                     positional_embeddings=None)
    config = FlowmatchingActionHeadConfig(
        input_embedding_dim=width, backbone_embedding_dim=width, hidden_size=width, max_seq_len=16,
        action_dim=action_dim, action_horizon=horizon, num_inference_timesteps=2, max_num_embodiments=2,
        max_state_dim=state_dim, num_target_vision_tokens=2,
        diffusion_model_cfg=dict(attention, num_layers=2, interleave_self_attention=True, cross_attention_dim=width),
        vl_self_attention_cfg=dict(attention, num_layers=1))
    head = FlowmatchingActionHead(config).eval().to(bf16)
    embodiment = torch.tensor([1] * BATCH)
    condition_args = (torch.randn(BATCH, vl_tokens, width, dtype=bf16), torch.ones(BATCH, vl_tokens, dtype=torch.bool),
                      torch.randn(BATCH, 1, state_dim, dtype=bf16), embodiment)
    with torch.no_grad():
        vl_embs, state_features = GrootCondition(head)(*condition_args)
    step_args = (vl_embs, state_features, torch.randn(BATCH, horizon, action_dim, dtype=bf16),
                 torch.full((BATCH,), 500), embodiment)
    return Policy({"condition": Program(GrootCondition(head), condition_args),
                   "denoise_step": Program(GrootDenoiseStep(head), step_args)}, {})


# ---- XVLA ---------------------------------------------------------------------------------------------------
class XvlaDenoiseStep(nn.Module):
    """The body of XVLAModel.generate_actions' loop: mix noise and the last action at t, the action
    space's preprocessing (gripper channels zeroed), the soft-prompted transformer; returns the new action."""

    def __init__(self, action_space: nn.Module, transformer: nn.Module):
        super().__init__()
        self.action_space = action_space
        self.transformer = transformer

    def forward(self, domain_id, vlm_features, aux_visual_inputs, x1, action, proprio, t):
        x_t = x1 * t.view(-1, 1, 1) + action * (1 - t).view(-1, 1, 1)
        proprio_m, x_t_m = self.action_space.preprocess(proprio, x_t)
        return self.transformer(domain_id=domain_id, action_with_noise=x_t_m, proprio=proprio_m, t=t,
                                vlm_features=vlm_features, aux_visual_inputs=aux_visual_inputs)


def xvla() -> Policy:
    """XVLA's denoising step (ee6d action space, SoftPromptedTransformer), bf16. XVLAModel itself cannot be
    built under transformers 5: its Florence-2 module imports transformers.modeling_attn_mask_utils, gone
    in 5.0; the step uses none of it (the VLM features are its inputs)."""
    from lerobot.policies.xvla.action_hub import build_action_space
    from lerobot.policies.xvla.soft_transformer import SoftPromptedTransformer
    space = build_action_space("ee6d")
    width, vlm_tokens, aux_tokens, chunk = 32, 5, 3, 4
    transformer = SoftPromptedTransformer(
        hidden_size=width, multi_modal_input_size=width, depth=1, num_heads=2, mlp_ratio=2.0, num_domains=2,
        dim_action=space.dim_action, dim_propio=space.dim_action, dim_time=8, len_soft_prompts=2, max_len_seq=32)
    step = XvlaDenoiseStep(space, transformer).eval().to(bf16)
    actions = (BATCH, chunk, space.dim_action)
    args = (torch.tensor([1] * BATCH), torch.randn(BATCH, vlm_tokens, width, dtype=bf16),
            torch.randn(BATCH, aux_tokens, width, dtype=bf16), torch.randn(actions, dtype=bf16),
            torch.zeros(actions, dtype=bf16), torch.randn(BATCH, space.dim_action, dtype=bf16),
            torch.full((BATCH,), 0.5, dtype=bf16))
    return Policy({"denoise_step": Program(step, args)}, {})


# ---- SmolVLA --------------------------------------------------------------------------------------------------
SMOLVLM_SPECIAL_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                          "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
                          "video_token": "<video>"}


def write_tiny_smolvlm(folder: Path, vocab: int = 64) -> Path:
    """A SmolVLM checkpoint folder without weights (config, processor, a word-level tokenizer with SmolVLM's
    special tokens): what SmolVLA reads through AutoConfig/AutoProcessor.from_pretrained(vlm_model_name)."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_smolvlm import SmolVLMImageProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor
    words = ["<unk>", "<pad>", *SMOLVLM_SPECIAL_TOKENS.values()]
    words += [f"w{i}" for i in range(vocab - len(words))]
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", pad_token="<pad>",
                                        extra_special_tokens=SMOLVLM_SPECIAL_TOKENS)
    SmolVLMProcessor(SmolVLMImageProcessor(), tokenizer, SmolVLMVideoProcessor(), image_seq_len=4).save_pretrained(folder)
    SmolVLMConfig(
        text_config=dict(model_type="llama", hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=vocab,
                         max_position_embeddings=128),
        vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=IMAGE[1], patch_size=8),
        scale_factor=2).save_pretrained(folder)
    return folder


def _smolvla_prefix_cache(model, lang_tokens: int, max_state: int):
    """VLAFlowMatching.sample_actions' first lines run eagerly: the prefix mask and the VLM's key/value
    cache, the denoising step's inputs."""
    from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks
    image = torch.randn(BATCH, *IMAGE)
    with torch.no_grad():
        embs, pad_masks, att_masks = model.embed_prefix(
            [image], [torch.ones(BATCH, dtype=torch.bool)], torch.randint(0, 60, (BATCH, lang_tokens)),
            torch.ones(BATCH, lang_tokens, dtype=torch.bool), state=torch.randn(BATCH, max_state))
        _, cache = model.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad_masks, att_masks), position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=True, fill_kv_cache=True)
    layers = sorted(cache)
    return pad_masks, tuple(cache[i]["key_states"] for i in layers), tuple(cache[i]["value_states"] for i in layers)


class SmolvlaDenoiseStep(nn.Module):
    """VLAFlowMatching.denoise_step, its key/value cache (a dict of dicts) passed as one tuple of keys and
    one of values."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, prefix_pad_masks, keys, values, x_t, timestep):
        cache = {i: {"key_states": k, "value_states": v} for i, (k, v) in enumerate(zip(keys, values))}
        return self.model.denoise_step(prefix_pad_masks=prefix_pad_masks, past_key_values=cache, x_t=x_t,
                                       timestep=timestep)


def smolvla(folder: Path) -> Policy:
    """SmolVLA's denoising step: the action expert attending to the VLM's cache. The SmolVLM half in bf16,
    as load_vlm_weights loads it; SmolVLA's own projections float32, as it makes them."""
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    config = SmolVLAConfig(**_features(state=6, action=6), vlm_model_name=str(write_tiny_smolvlm(folder)),
                           load_vlm_weights=False, num_vlm_layers=2, chunk_size=4, n_action_steps=4,
                           max_state_dim=8, max_action_dim=8, expert_width_multiplier=0.5)
    model = SmolVLAPolicy(config).eval().model
    model.vlm_with_expert.to(bf16)
    pad_masks, keys, values = _smolvla_prefix_cache(model, lang_tokens=3, max_state=8)
    args = (pad_masks, keys, values, torch.randn(BATCH, 4, 8), torch.full((BATCH,), 0.5))
    return Policy({"denoise_step": Program(SmolvlaDenoiseStep(model), args)}, {})


# ---- pi0 ----------------------------------------------------------------------------------------------------
_ABSENT = object()


@contextlib.contextmanager
def _patched(patches: list[tuple[object, str, object]]):
    """Sets each (owner, name, value) for the duration; after, puts back what was there (or its absence)."""
    saved = [(owner, name, owner.__dict__.get(name, _ABSENT)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def _openpi_transformers(width: int):
    """What pi0's code needs from LeRobot's transformers fork (based on transformers 4.53, not on PyPI),
    given for the duration of the build and export, undone after:
    - `transformers.models.siglip.check`, whose check_whether_transformers_replace_is_installed_correctly()
      PI0Pytorch calls: a module answering True.
    - the fork's Gemma RMSNorm(x, cond=...) -> (normed, gate) and modeling_gemma._gated_residual: pi0 (not
      pi05) passes cond=None everywhere, where the fork returns (RMSNorm(x), None) and x + y; the adapter
      does exactly that and refuses any other cond (adaRMS exists only in the fork).
    - transformers 4.x's PaliGemmaForConditionalGeneration.language_model and get_image_features returning
      the projected features, which transformers 5 moved (model.language_model) and wrapped (pooler_output).
    - tiny sizes: pi0's get_gemma_config knows only gemma_300m and gemma_2b, and PaliGemma's default vision
      tower is SigLIP-So400m; the policy is built with a one-layer Gemma of `width` and a one-layer SigLIP.
    """
    from transformers import PaliGemmaConfig
    from transformers.models.gemma import modeling_gemma
    from transformers.models.paligemma import modeling_paligemma
    from lerobot.policies.pi0 import modeling_pi0

    stock_norm = modeling_gemma.GemmaRMSNorm.forward
    stock_image_features = modeling_paligemma.PaliGemmaModel.get_image_features

    def norm(self, x, cond=_ABSENT):
        if cond is _ABSENT:  # transformers' own callers
            return stock_norm(self, x)
        if cond is not None:
            raise NotImplementedError("adaRMS conditioning (pi05) exists only in LeRobot's transformers fork")
        return stock_norm(self, x), None

    def gated_residual(x, y, gate):
        if gate is not None:
            raise NotImplementedError("gated residuals (pi05) exist only in LeRobot's transformers fork")
        return x + y

    def image_features(self, pixel_values, **kwargs):
        return stock_image_features(self, pixel_values, **kwargs).pooler_output

    check = types.ModuleType("transformers.models.siglip.check")
    check.check_whether_transformers_replace_is_installed_correctly = lambda: True
    tiny_vision = dict(model_type="siglip_vision_model", hidden_size=width, num_hidden_layers=1,
                       num_attention_heads=2, patch_size=8, image_size=IMAGE[1], intermediate_size=64)
    config_mapping = modeling_pi0.CONFIG_MAPPING
    patches = [
        (modeling_gemma.GemmaRMSNorm, "forward", norm),
        (modeling_gemma, "_gated_residual", gated_residual),
        (modeling_paligemma.PaliGemmaModel, "get_image_features", image_features),
        (modeling_paligemma.PaliGemmaForConditionalGeneration, "language_model",
         property(lambda self: self.model.language_model)),
        (modeling_pi0, "get_gemma_config", lambda variant: modeling_pi0.GemmaConfig(
            width=width, depth=1, mlp_dim=2 * width, num_heads=8, num_kv_heads=1, head_dim=width // 8)),
        (modeling_pi0, "CONFIG_MAPPING", {"paligemma": lambda: PaliGemmaConfig(vision_config=tiny_vision),
                                          "gemma": config_mapping["gemma"]}),
    ]
    sys.modules[check.__name__] = check
    try:
        with _patched(patches):
            yield modeling_pi0
    finally:
        del sys.modules[check.__name__]


class Pi0Prefix(nn.Module):
    """PI0Pytorch.sample_actions' first lines: embed images and language, run PaliGemma's language model
    over them once; returns the prefix mask and the key/value cache (one tuple of keys, one of values)."""

    def __init__(self, model: nn.Module, modeling_pi0: types.ModuleType):
        super().__init__()
        self.model = model
        self.make_att_2d_masks = modeling_pi0.make_att_2d_masks

    def forward(self, image, image_mask, lang_tokens, lang_masks):
        model = self.model
        embs, pad_masks, att_masks = model.embed_prefix([image], [image_mask], lang_tokens, lang_masks)
        att_4d = model._prepare_attention_masks_4d(self.make_att_2d_masks(pad_masks, att_masks))
        model.paligemma_with_expert.paligemma.language_model.config._attn_implementation = "eager"
        _, cache = model.paligemma_with_expert.forward(
            attention_mask=att_4d, position_ids=torch.cumsum(pad_masks, dim=1) - 1, past_key_values=None,
            inputs_embeds=[embs, None], use_cache=True)
        return pad_masks, tuple(layer.keys for layer in cache.layers), tuple(layer.values for layer in cache.layers)


class Pi0DenoiseStep(nn.Module):
    """PI0Pytorch.denoise_step, its key/value cache (a transformers DynamicCache) passed as tuples."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, state, prefix_pad_masks, keys, values, x_t, timestep):
        from transformers import DynamicCache
        cache = DynamicCache()
        for layer, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, layer)
        return self.model.denoise_step(state=state, prefix_pad_masks=prefix_pad_masks, past_key_values=cache,
                                       x_t=x_t, timestep=timestep)


@contextlib.contextmanager
def pi0():
    """pi0's prefix and denoising step, float32 (PI0Config's dtype: in bfloat16 pi0 keeps its norms float32
    and relies on the fork's decoder layers to cast between them, which transformers' own layers do not).
    A context: the programs must be exported inside it (see _openpi_transformers)."""
    width, lang_tokens, max_dim = 32, 3, 8
    with _openpi_transformers(width) as modeling_pi0:
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        config = PI0Config(**_features(state=6, action=6), dtype="float32", chunk_size=4, n_action_steps=4,
                           max_state_dim=max_dim, max_action_dim=max_dim, image_resolution=IMAGE[1:])
        model = modeling_pi0.PI0Policy(config).eval().model
        # PaliGemmaWithExpertModel fixes the projector's width at PaliGemma-3B's 2048; the tiny model's
        # text width is `width`.
        projector = model.paligemma_with_expert.paligemma.model.multi_modal_projector
        projector.linear = nn.Linear(projector.linear.in_features, width)
        prefix = Pi0Prefix(model, modeling_pi0)
        prefix_args = (torch.randn(BATCH, *IMAGE), torch.ones(BATCH, dtype=torch.bool),
                       torch.randint(0, 1000, (BATCH, lang_tokens)), torch.ones(BATCH, lang_tokens, dtype=torch.bool))
        with torch.no_grad():
            pad_masks, keys, values = prefix(*prefix_args)
        step_args = (torch.randn(BATCH, max_dim), pad_masks, keys, values, torch.randn(BATCH, 4, max_dim),
                     torch.full((BATCH,), 0.5))
        yield Policy({"prefix": Program(prefix, prefix_args), "denoise_step": Program(Pi0DenoiseStep(model), step_args)},
                     {"default": {"precision": "fp32"}})


# ---- WALL-OSS ---------------------------------------------------------------------------------------------
def _without_empty_expert_skip(forward: Callable) -> Callable:
    """SparseMoeBlock.forward as its authors wrote it, less `if mask.sum() == 0: continue` (README, "Experts
    routed by an input": a Python branch on data that torch.export refuses; the result is the same). Made from
    the installed source, those two lines deleted, so the rest is LeRobot's own."""
    import inspect
    import textwrap
    source, first = inspect.getsourcelines(forward)
    lines = textwrap.dedent("".join(source)).splitlines(keepends=True)
    skip = next(i for i, line in enumerate(lines) if line.strip() == "if mask.sum() == 0:")
    if lines[skip + 1].strip() != "continue":
        raise AssertionError("WALL-OSS's SparseMoeBlock changed: its empty-expert skip is not the two lines known")
    lines[skip:skip + 2] = ["\n", "\n"]  # blank, so every other line keeps its number (source lines in messages)
    namespace: dict = {}
    exec(compile("\n" * (first - 1) + "".join(lines), inspect.getsourcefile(forward), "exec"),  # noqa: S102
         forward.__globals__, namespace)
    return namespace[forward.__name__]


@contextlib.contextmanager
def _wall_x_transformers():
    """What WALL-OSS's code (written for transformers 4.57) needs under transformers 5.24, given for the
    duration of the build and export, undone after:
    - `transformers.modeling_attn_mask_utils` (gone in 5.0), whose AttentionMaskConverter its qwen2_5_vl_moe.py
      imports and calls only for SDPA attention: a module whose converter refuses (the policy runs "eager",
      WallXConfig's default).
    - layer type "dense": its Qwen2_5_VLConfig sets layer_types = ["dense"] * layers, which transformers 5's
      config validation refuses; it is read nowhere.
    - Qwen2_5_VLForConditionalGeneration.__init__ (its base class) as PreTrainedModel's: transformers 5's builds
      its own Qwen2.5-VL from the config, which WALL-OSS's 4.x-style config cannot build (no rope_parameters);
      Qwen2_5_VLMoEForAction replaces every module that __init__ makes (visual, model, lm_head) anyway.
    - RoPE type "default" in qwen2_5_vl_moe's ROPE_INIT_FUNCTIONS, which transformers 5 dropped (its models
      compute it themselves): inv_freq = theta ** -(2i / head_dim), attention scaling 1.
    - SparseMoeBlock.forward without the empty-expert skip (_without_empty_expert_skip).
    """
    import transformers.configuration_utils as configuration_utils
    from transformers.modeling_utils import PreTrainedModel

    class AttentionMaskConverter:
        @staticmethod
        def _refuse(*args, **kwargs):
            raise NotImplementedError("SDPA attention masks need transformers 4.x; the WALL-OSS test runs eager")

        _ignore_causal_mask_sdpa = _unmask_unattended = _refuse

    def default_rope(config, device=None, **kwargs):
        dim = config.hidden_size // config.num_attention_heads
        return 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim), 1.0

    masks = types.ModuleType("transformers.modeling_attn_mask_utils")
    masks.AttentionMaskConverter = AttentionMaskConverter
    sys.modules[masks.__name__] = masks
    allowed = configuration_utils.ALLOWED_ATTN_LAYER_TYPES
    configuration_utils.ALLOWED_ATTN_LAYER_TYPES = (*allowed, "dense")
    from lerobot.policies.wall_x import modeling_wall_x
    from lerobot.policies.wall_x.qwen_model import qwen2_5_vl_moe
    base = modeling_wall_x.Qwen2_5_VLForConditionalGeneration
    patches = [
        (base, "__init__", lambda self, config: PreTrainedModel.__init__(self, config)),
        (qwen2_5_vl_moe, "ROPE_INIT_FUNCTIONS", {**qwen2_5_vl_moe.ROPE_INIT_FUNCTIONS, "default": default_rope}),
        (qwen2_5_vl_moe.SparseMoeBlock, "forward", _without_empty_expert_skip(qwen2_5_vl_moe.SparseMoeBlock.forward)),
    ]
    try:
        with _patched(patches):
            yield modeling_wall_x
    finally:
        configuration_utils.ALLOWED_ATTN_LAYER_TYPES = allowed
        del sys.modules[masks.__name__]


class _ActionTokens:
    """The two token ids Qwen2_5_VLMoEForAction reads from its processor's tokenizer (define_action_token_id);
    WALL-OSS's own processor comes from the hub."""

    ids = {"<|action|>": 62, "<|propri|>": 63}

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.ids[token]


class WallXDenoiseStep(nn.Module):
    """One Euler step's network of Qwen2_5_VLMoEForAction.predict(predict_mode="diffusion"): the body of its
    nested `step` (not reachable as a method), its lines in its order: the action head embeds the noisy
    actions and the time, they replace the action tokens' embeddings, the Qwen2.5-VL MoE model runs over the
    whole prompt (the action tokens through the action expert, moe_token_types = input_ids == <|action|>, as
    WallXPolicy.preprocess_inputs makes them), and the action tokens' hidden states are projected back.
    Without the step's `assert action_mask.any()` (a Python branch on data); the count is checked by the
    engine instead (partitioner/counted_rows.py)."""

    def __init__(self, model: nn.Module, horizon: int, action_dim: int):
        super().__init__()
        self.model, self.horizon, self.action_dim = model, horizon, action_dim

    def forward(self, input_ids, inputs_embeds, attention_mask, position_ids, noisy_action, timestep, dof_mask):
        model = self.model
        action_mask = input_ids == model.action_token_id_set["action_token_id"]
        moe_token_types = action_mask
        timestep = timestep.unsqueeze(0).repeat(noisy_action.shape[0])
        action_embed = model.action_preprocessor.step(timestep=timestep, noisy_action=noisy_action, dof_mask=dof_mask)
        action_embed = action_embed.reshape(-1, inputs_embeds.shape[-1])
        action_embed = action_embed.to(dtype=inputs_embeds.dtype, device=inputs_embeds.device)
        temp_inputs_embeds = inputs_embeds.clone()
        temp_inputs_embeds[action_mask] = action_embed
        transformer_outputs = model.model(
            input_ids=None, attention_mask=attention_mask, position_ids=position_ids, past_key_values=None,
            inputs_embeds=temp_inputs_embeds, moe_token_types=moe_token_types, use_cache=True,
            output_attentions=False, output_hidden_states=False, return_dict=True)
        hidden_states = transformer_outputs.last_hidden_state
        action_hidden_states = hidden_states[action_mask].to(torch.float32)
        pred = model.action_preprocessor.action_proj_back(action_hidden_states)
        return pred.reshape(noisy_action.shape[0], self.horizon, self.action_dim)


@contextlib.contextmanager
def wall_x():
    """WALL-OSS's flow-matching denoising step: Qwen2_5_VLMoEForAction, tiny (two decoder layers whose MLP is
    the token-type MoE of a VLM expert and an action expert, as wide as the hidden states), in bf16 with its
    norms and action head float32 (to_bfloat16_for_selected_params, as WallXPolicy loads it). WallXPolicy
    itself loads from the hub, so the model class is built from a local config. Its vision tower is not
    exported: it reads its patch grid from a tensor (rot_pos_emb and get_window_index loop over grid_thw's
    values), a data-dependent Python loop torch.export refuses; the step takes the prompt's embeddings.
    A context: the programs must be exported inside it (_wall_x_transformers)."""
    hidden, horizon, dofs = 32, 4, {"arm": 6, "gripper": 1}
    with _wall_x_transformers() as modeling_wall_x:
        from lerobot.policies.wall_x.qwen_model.configuration_qwen2_5_vl import Qwen2_5_VLConfig
        experts = [dict(hidden_size=hidden, intermediate_size=ffn, hidden_act="silu") for ffn in (64, 48)]
        config = Qwen2_5_VLConfig(
            vocab_size=64, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                               fullatt_block_indexes=[0], initializer_range=0.02),
            num_experts=2, experts=experts, dim_inputs=(hidden, hidden), mlp_moe=True, dof_config=dofs,
            agent_pos_config=dofs, pad_token_id=0)
        config._attn_implementation = "eager"
        processor = types.SimpleNamespace(tokenizer=_ActionTokens())
        model = modeling_wall_x.Qwen2_5_VLMoEForAction(config, processor=processor).eval()
        model.to_bfloat16_for_selected_params()
        action_dim, prompt = sum(dofs.values()), 6
        input_ids = torch.randint(1, 58, (BATCH, prompt + 1 + horizon))
        input_ids[:, prompt] = _ActionTokens.ids["<|propri|>"]
        input_ids[:, prompt + 1:] = _ActionTokens.ids["<|action|>"]
        tokens = input_ids.shape[1]
        args = (input_ids, torch.randn(BATCH, tokens, hidden, dtype=bf16), torch.ones(BATCH, tokens, dtype=torch.long),
                torch.arange(tokens).expand(3, BATCH, tokens).contiguous(), torch.randn(BATCH, horizon, action_dim),
                torch.tensor(0.3), torch.ones(BATCH, horizon, action_dim))
        yield Policy({"denoise_step": Program(WallXDenoiseStep(model, horizon, action_dim), args)}, {})
