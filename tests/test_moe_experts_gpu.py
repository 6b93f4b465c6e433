"""The fused MoE experts kernels on a GPU, through the C++ launcher (no Triton in the process), against
et_trt_backend.moe_experts.reference (float32 on the CPU).

Runs on the device through benchmarks/device/moe_run.sh, which builds the launcher and points
ET_TRT_KERNEL_IMAGES at images compiled on the CPU machine; skipped where there is no CUDA GPU. The
invalid-id, odd-size, empty, single-token, family and wgmma cases also run under `compute-sanitizer --tool memcheck`
there.
"""

import os
import sys

import pytest
import torch
from support.gpu_launchers import launcher_device
from support.moe_inputs import make_inputs
from support.moe_models import HF_FAMILIES, HF_HIDDEN

from et_trt_backend import moe_experts
from et_trt_backend.kernels.launcher import moe_rule_path
from et_trt_backend.plugin_names import MOE_ACTIVATIONS, MOE_GATE_UP_LAYOUTS, MOE_GATED_ACTIVATIONS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs an NVIDIA GPU (runs on the device through benchmarks/device/moe_run.sh)"),
]


def _launcher(dtype):
    from et_trt_backend.kernels import moe_op

    return moe_op.launcher_for(launcher_device(), dtype)


def _run(inputs, activation="swiglu", layout="concat", alpha=moe_experts.GPTOSS_ALPHA,
         limit=moe_experts.GPTOSS_LIMIT, path="rule"):
    """Launches into a NaN-poisoned output and a workspace of 0xff bytes (NaN in the float rows, -1 in the
    offsets, pairs and tile table), so an unwritten output or a row read before it is written fails the
    comparison; `path`: the GEMM path for this launch (MoEExpertsLauncher.set_gemm_path). Returns (out, the kernels
    that ran)."""
    from et_trt_backend.kernels.launcher import moe_workspace_bytes
    from et_trt_backend.kernels.moe_op import launch_args

    hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = (
        None if t is None else t.cuda().contiguous() for t in inputs)
    tokens, top_k, experts, size, ffn = moe_experts.check_inputs(
        hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation, layout)
    launcher = _launcher(hidden.dtype)
    out = torch.full((tokens, size), float("nan"), dtype=hidden.dtype, device="cuda")
    workspace = torch.full((moe_workspace_bytes(tokens, top_k, experts, size, ffn) + 1,), 0xFF, dtype=torch.uint8,
                           device="cuda")
    args = launch_args(hidden, ids, weights, w_gate_up, w_down, out, workspace, experts=experts, ffn=ffn,
                       b_gate_up=b_gate_up, b_down=b_down, activation=activation, gate_up_layout=layout, alpha=alpha,
                       limit=limit)
    launcher.set_gemm_path(path)
    try:
        launcher.launch(args, torch.cuda.current_stream().cuda_stream)
    finally:
        launcher.set_gemm_path("rule")  # the launcher is shared with the other tests
    torch.cuda.synchronize()
    return out.cpu(), launcher.last_kernels


def _check(inputs, activation="swiglu", layout="concat", bound=1e-2, path="rule"):
    """The kernels' result within `bound` of the float32 reference (relative to its norm), every row written.
    Returns the kernels that ran."""
    out, kernels = _run(inputs, activation, layout, path=path)
    want = moe_experts.reference(*inputs, activation=activation, gate_up_layout=layout)
    assert not out.isnan().any(), f"{kernels}: unwritten (NaN-poisoned) outputs remain"
    err = float((out.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6))
    assert err < bound, f"{kernels}: relative error {err:.3e}"
    zero_rows = (want == 0).all(1)  # tokens of no valid pair
    assert (out[zero_rows] == 0).all(), f"{kernels}: rows of no valid pair are not zero"
    return kernels


def _family_experts(name):
    """(experts, FFN size) of a tests/moe_models.HF_FAMILIES family's tiny config."""
    extra = HF_FAMILIES[name][3]
    experts = extra.get("num_local_experts") or extra.get("num_experts") or extra.get("n_routed_experts")
    return experts, extra.get("moe_intermediate_size", extra.get("intermediate_size"))


@pytest.mark.parametrize("family", list(HF_FAMILIES))
@pytest.mark.parametrize("tokens", [1, 7, 64], ids=lambda t: f"t{t}")
def test_every_family_expert_shape(family, tokens):
    """Each family's tiny config (the partitioner's test models): GPT-OSS as it stores its experts
    (interleaved gate and up rows, biases, its clamped GLU), the others SwiGLU with concatenated rows."""
    experts, ffn = _family_experts(family)
    gpt_oss = family == "gpt_oss"
    activation = "gptoss_glu" if gpt_oss else "swiglu"
    inputs = make_inputs(tokens, 2, experts, HF_HIDDEN, ffn, activation, bias=gpt_oss, seed=tokens)
    _check(inputs, activation, "interleaved" if gpt_oss else "concat")


@pytest.mark.parametrize("activation", list(MOE_ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_activation_and_layout(activation, dtype):
    layouts = MOE_GATE_UP_LAYOUTS if moe_experts.is_gated(activation) else ("concat",)
    for layout in layouts:
        inputs = make_inputs(33, 2, 8, 256, 128, activation, dtype=dtype, bias=True, seed=MOE_ACTIVATIONS[activation])
        _check(inputs, activation, layout)


# Rows per expert (tokens * top_k / experts) that make the launcher take each tiling (moe_experts_launcher.cc).
TILINGS = {"small": (4, 2, 8), "tile": (160, 2, 8), "large": (600, 4, 8)}


@pytest.mark.parametrize("tiling", list(TILINGS))
def test_each_tiling(tiling):
    tokens, top_k, experts = TILINGS[tiling]
    kernels = _check(make_inputs(tokens, top_k, experts, 512, 384, "swiglu", seed=11))
    assert f"moe_gate_up_gated ({tiling})" in kernels and f"moe_down ({tiling})" in kernels, kernels
    assert len(kernels.split(" + ")) == 4, f"not 4 launches: {kernels}"


def test_odd_hidden_and_ffn_take_any():
    kernels = _check(make_inputs(21, 3, 5, 100, 77, "swiglu", bias=True, seed=12), "swiglu", "interleaved")
    assert "(any)" in kernels


def test_single_token_and_no_tokens():
    _check(make_inputs(1, 2, 8, 1024, 512, "swiglu", seed=13))
    out, kernels = _run(make_inputs(0, 2, 8, 64, 32, "swiglu"))
    assert out.shape == (0, 64) and kernels == ""


def test_empty_experts_and_skewed_routing():
    """Every token to experts 3 and 5 of 16 (one expert's rows over many tiles, 14 experts empty)."""
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(300, 2, 16, 256, 128, "swiglu", seed=14)
    ids = torch.tensor([[3, 5]], dtype=torch.int32).repeat(300, 1)
    _check((hidden, ids, weights, w_gate_up, w_down, None, None))


def test_invalid_ids_are_dropped():
    """Negative ids, ids at and past E and the int32 extremes contribute nothing and are never an index."""
    hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = make_inputs(
        200, 4, 12, 128, 96, "swiglu", bias=True, invalid=0.3, seed=15)
    ids[0] = torch.tensor([-(2**31), 2**31 - 1, 12, -1], dtype=torch.int32)  # a token of no valid pair
    _check((hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down))
    out, _ = _run((hidden, torch.full_like(ids, 99), weights, w_gate_up, w_down, None, None))
    assert (out == 0).all()


@pytest.mark.parametrize("experts", [64, 200, 1000], ids=["e64", "e256", "e1024"])
def test_route_variants_and_many_pairs(experts):
    """Each route kernel (by the experts it holds), with more pairs than one route program takes."""
    kernels = _check(make_inputs(700, 4, experts, 128, 64, "silu", seed=experts), "silu")
    assert kernels.startswith("moe_route (e%d)" % {64: 64, 200: 256, 1000: 1024}[experts]), kernels


def test_routing_weights_in_the_activations_dtype():
    inputs = make_inputs(50, 2, 8, 256, 128, "geglu_tanh", weights_dtype=torch.bfloat16, seed=16)
    _check(inputs, "geglu_tanh", "blocked8")


def test_dynamic_tokens_one_launcher():
    """One launcher (per dtype), many token counts, fresh inputs each time."""
    for i, tokens in enumerate([1, 3, 17, 64, 200, 1000, 5]):
        _check(make_inputs(tokens, 2, 16, 512, 256, "swiglu", seed=100 + i))


def test_moe_layer_shape():
    """An MoE layer's proportions at a tenth of the size: 64 experts of hidden 1024 and FFN 512, top-8, 64 rows per
    expert; the launcher takes the path its rule names (the Triton tilings at these sizes)."""
    kernels = _check(make_inputs(512, 8, 64, 1024, 512, "swiglu", seed=17), "swiglu", "blocked8")
    _assert_path(kernels, moe_rule_path(512, 8, 64, 1024, 512))


def test_rule_takes_wgmma_at_large_sizes():
    """Hidden and FFN 2560, 32 rows per expert, the rule's wgmma thresholds: the launcher's rule takes the wgmma
    GEMMs (on sm_90 with its images; elsewhere the Triton tilings), set_gemm_path("tilings") the Triton tilings."""
    assert moe_rule_path(64, 2, 4, 2560, 2560) == "wgmma"
    inputs = make_inputs(64, 2, 4, 2560, 2560, "swiglu", seed=24)
    _assert_path(_check(inputs, "swiglu", "blocked8"), "wgmma")
    _assert_path(_check(inputs, "swiglu", "blocked8", path="tilings"), "tilings")


def _takes_wgmma() -> bool:
    """Whether this GPU runs the wgmma kernels (sm_90 with their images: moe_aot's sm_90a set)."""
    from et_trt_backend.kernels import moe_op

    pool = moe_op.load_images(os.environ[moe_op.IMAGES_ENV]) if os.environ.get(moe_op.IMAGES_ENV) else []
    return torch.cuda.get_device_capability() == (9, 0) and (
        not pool or any(i.variant == "wgmma" and i.kernel.startswith("moe_") for i in pool))


def _assert_path(kernels: str, path: str = "wgmma") -> None:
    """For path "wgmma": on sm_90 the wgmma GEMMs behind the gather (five launches), elsewhere the Triton tilings
    (four); for "tilings": the Triton tilings."""
    if path == "wgmma" and _takes_wgmma():
        assert "moe_gather (any) + moe_gate_up_gated (wgmma) + moe_down (wgmma)" in kernels, kernels
    else:
        assert "wgmma" not in kernels and len(kernels.split(" + ")) == 4, kernels


@pytest.mark.parametrize("activation", MOE_GATED_ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_many_rows_per_expert(activation, dtype):
    """128 rows per expert, blocked8 rows, biases, float16 weights, a few invalid ids, the wgmma path forced: on
    sm_90 the wgmma kernels' epilogues (the activation on rows r and r + 8; the weight, bias and float32 scatter),
    elsewhere "large"."""
    _launcher(dtype)
    kernels = _check(make_inputs(1024, 8, 64, 1024, 512, activation, dtype=dtype, bias=True, invalid=0.05,
                                 weights_dtype=dtype if activation == "geglu_erf" else torch.float32,
                                 seed=MOE_ACTIVATIONS[activation]), activation, "blocked8", path="wgmma")
    _assert_path(kernels)


def test_every_wgmma_tile_width():
    """Experts of 5 to 253 rows (every tile width 8..256 of grouped_mm_sm90.cu), of 257 and 600 (two and three
    tiles), of 1 and of none; top-1, shuffled tokens; the wgmma path forced."""
    sizes = [8 * i - 3 for i in range(1, 33)] + [257, 600, 1, 0]
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(19))].to(torch.int32)[:, None]
    hidden, _, weights, w_gate_up, w_down, b_gate_up, b_down = make_inputs(
        len(ids), 1, len(sizes), 256, 136, "swiglu", bias=True, seed=20)
    _assert_path(_check((hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down), "swiglu", "blocked8",
                        path="wgmma"))


@pytest.mark.parametrize("case", ["invalid", "all_invalid", "single_token", "empty_experts"])
def test_wgmma_gather_invalid_ids_single_token_empty_experts(case):
    """The wgmma path's row gather and GEMMs: invalid ids (the int32 extremes, a
    token of no valid pair), every id invalid (no rows at all), a single token, and all tokens on 2 of 16 experts;
    the wgmma path forced (the memcheck subset of benchmarks/device/moe_run.sh runs these)."""
    tokens, experts = {"single_token": (1, 8), "empty_experts": (300, 16)}.get(case, (200, 12))
    hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = make_inputs(
        tokens, 2, experts, 256, 136, "swiglu", bias=True, invalid=0.3 if case == "invalid" else 0.0, seed=24)
    if case == "invalid":
        ids[0] = torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32)
    elif case == "all_invalid":
        ids = torch.full_like(ids, experts)
    elif case == "empty_experts":
        ids = torch.tensor([[3, 5]], dtype=torch.int32).repeat(tokens, 1)
    inputs = (hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down)
    if case == "all_invalid":
        out, kernels = _run(inputs, "swiglu", "blocked8", path="wgmma")
        assert (out == 0).all()
    else:
        kernels = _check(inputs, "swiglu", "blocked8", path="wgmma")
    _assert_path(kernels)


def test_forced_gemm_path():
    """set_gemm_path (benchmarks/moe_sweep.py times each path at every shape): 16 rows per expert, where the rule
    takes the Triton tilings, on the wgmma path (sm_90 with its images; the Triton tilings elsewhere)."""
    assert moe_rule_path(64, 2, 8, 256, 136) == "tilings"
    _assert_path(_check(make_inputs(64, 2, 8, 256, 136, "swiglu", bias=True, seed=23), "swiglu", "blocked8",
                        path="wgmma"))
    with pytest.raises(ValueError, match="unknown MoE GEMM path"):
        _launcher(torch.bfloat16).set_gemm_path("fastest")


@pytest.mark.parametrize("path", ["tilings", "wgmma"])
def test_kernels_wait_for_the_work_before_them(path):
    """Programmatic dependent launch (from sm_90 the launcher starts each kernel of ours after a block's first while
    the one before it runs): three blocks back to back on one stream into one workspace, no sync between, each right
    after the copies that write its hidden rows and ids into shared buffers; the Triton tilings (route, GEMMs,
    combine) and the wgmma path (route, gather, combine around GroupedMMLauncher's GEMMs). Each output matches its
    reference, and the same launches without the overlap exactly."""
    from et_trt_backend.kernels.launcher import moe_workspace_bytes
    from et_trt_backend.kernels.moe_op import launch_args

    cases = [[t.cuda() for t in make_inputs(64, 2, 8, 256, 136, "swiglu", seed=seed)[:5]] for seed in (31, 32, 33)]
    launcher = _launcher(torch.bfloat16)
    hidden, ids = torch.full_like(cases[0][0], float("nan")), torch.full_like(cases[0][1], -1)
    workspace = torch.full((moe_workspace_bytes(64, 2, 8, 256, 136),), 0xFF, dtype=torch.uint8, device="cuda")

    def run_all() -> list[torch.Tensor]:
        outs = [torch.full_like(hidden, float("nan")) for _ in cases]
        for (case_hidden, case_ids, weights, w_gate_up, w_down), out in zip(cases, outs):
            hidden.copy_(case_hidden)
            ids.copy_(case_ids)
            launcher.launch(launch_args(hidden, ids, weights, w_gate_up, w_down, out, workspace, experts=8, ffn=136,
                                        gate_up_layout="blocked8"), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return [out.cpu() for out in outs]

    launcher.set_gemm_path(path)
    try:
        overlapped, kernels = run_all(), launcher.last_kernels
        launcher.set_programmatic_launch(False)
        serialized = run_all()
    finally:  # the launcher is shared with the other tests
        launcher.set_programmatic_launch(True)
        launcher.set_gemm_path("rule")
    _assert_path(kernels, path)
    for case, out, plain in zip(cases, overlapped, serialized):
        want = moe_experts.reference(*[t.cpu() for t in case], gate_up_layout="blocked8")
        err = float((out.float() - want.float()).norm() / want.float().norm())
        assert err < 1e-2, f"{kernels}: relative error {err:.3e}"
        assert torch.equal(out, plain), f"{kernels}: the overlapped launches differ from the serialized ones"


def test_eager_op_matches_reference():
    from et_trt_backend.kernels import moe_op  # noqa: F401 (registers the op)

    _launcher(torch.bfloat16)
    inputs = make_inputs(40, 2, 8, 256, 128, "gptoss_glu", bias=True, invalid=0.1, seed=18)
    out = torch.ops.et_trt.moe_experts(*(t.cuda() for t in inputs), activation="gptoss_glu",
                                       gate_up_layout="interleaved")
    want = moe_experts.reference(*inputs, activation="gptoss_glu", gate_up_layout="interleaved")
    err = float((out.cpu().float() - want.float()).norm() / want.float().norm())
    assert err < 1e-2


def test_errors_are_clear():
    from et_trt_backend.kernels.launcher import LauncherError, MoEExpertsArgs

    launcher = _launcher(torch.bfloat16)
    hidden, ids, weights, w_gate_up, w_down = (t.cuda() for t in make_inputs(4, 2, 4, 64, 20, "swiglu")[:5])
    out = torch.empty(4, 64, dtype=torch.bfloat16, device="cuda")
    workspace = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")

    def args(**change):
        base = dict(hidden=hidden.data_ptr(), topk_ids=ids.data_ptr(), topk_weights=weights.data_ptr(),
                    weights_fp32=1, w_gate_up=w_gate_up.data_ptr(), w_down=w_down.data_ptr(), out=out.data_ptr(),
                    tokens=4, top_k=2, experts=4, hidden_size=64, ffn=20, activation=0, gate_up_layout=0,
                    alpha=1.702, limit=7.0, workspace=workspace.data_ptr(), workspace_bytes=workspace.numel())
        return MoEExpertsArgs(**{**base, **change})

    stream = torch.cuda.current_stream().cuda_stream
    for change, match in [(dict(activation=8), "unknown activation 8"),
                          (dict(gate_up_layout=2), "blocked8 needs ffn % 8 == 0"),
                          (dict(experts=1025), "more experts than the route kernel holds"),
                          (dict(workspace_bytes=100), "workspace of workspace_bytes"),
                          (dict(hidden=hidden.data_ptr() + 2), "16-byte aligned"),
                          (dict(tokens=-1), "negative size"),
                          (dict(tokens=2**30, top_k=4), "32-bit indexing")]:
        with pytest.raises(LauncherError, match=match):
            launcher.launch(args(**change), stream)


def test_no_triton_in_this_process():
    if not os.environ.get("ET_TRT_KERNEL_IMAGES"):
        pytest.skip("images compiled in this process (ET_TRT_KERNEL_IMAGES unset)")
    assert "triton" not in sys.modules, "Triton was imported by the process that ran the checks"
