"""The fused MoE experts with FP8 weights on the CPU machine: the kernels' semantics in Triton's interpreter
(tests/moe_fp8_interpreter_check.py), their AOT images for every FP8 architecture (resources, SASS), the
quantization and reference (moe_experts_fp8), and the eager op's FP8 signature. The GPU side is
tests/test_moe_experts_fp8_gpu.py."""

import collections
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from et_trt_backend import moe_experts, moe_experts_fp8
from et_trt_backend.kernels import moe_aot

REPO = pathlib.Path(__file__).resolve().parents[1]
_SHARED_KIB = {89: 99, 90: 227, 100: 227, 110: 227, 120: 99}  # shared memory a block may opt in to


def test_fp8_kernels_in_triton_interpreter():
    """Every activation and gate+up layout, biases, float16 routing weights, odd H and F (a partial scale block),
    one token, skewed routing with empty experts and invalid ids, every id invalid: route, FP8 gate+up, FP8 down
    and combine against the FP8 reference and float32, every buffer poisoned; the down GEMM's sweep candidates
    (moe_fp8_down.py) at the odd sizes, three scale blocks, skewed routing, one token and every id invalid."""
    pytest.importorskip("triton", reason="the MoE kernels are Triton source")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "moe_fp8_interpreter_check.py")],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0 and "fp8 interpreter ok" in result.stdout, (result.stdout + result.stderr)[-3000:]


def _sass_ops(image, tmp_path) -> collections.Counter:
    import triton

    path = tmp_path / f"{image.kernel}_{image.variant}_{image.arch}.cubin"
    path.write_bytes(image.image.bytes())
    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    return collections.Counter(m.split(".")[0] for m in re.findall(
        r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]+)", sass, re.M))


# One architecture of each FP8 family (sm_110a compiles as sm_100a does, with the same tilings).
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a", "sm_100a", "sm_120a"])
def test_every_fp8_arch_compiles(arch, tmp_path):
    pytest.importorskip("triton", reason="the MoE kernels are Triton source")
    images = moe_aot.moe_experts_images([arch], "bf16", "fp8")
    assert images and all(i.format == "cubin" for i in images)  # no PTX fallback: sm_80 has no FP8 MMA
    configs = len(moe_aot._fp8_configs(arch))
    # sm_90a also has the wgmma kernel's FP8 down (grouped_mm_sm90.cu; tests/test_kernel_sm90.py checks its SASS),
    # which writes its rows in bf16, and the combine that reads them so.
    wgmma = [i for i in images if i.variant == "wgmma"]
    assert [(i.kernel, i.weight_format) for i in wgmma] == ([("moe_down", "fp8")] if arch == "sm_90a" else [])
    assert {(i.kernel, i.variant) for i in images if i.y_in_dtype} == (
        {("moe_down", "wgmma"), ("moe_combine", "y_in_dtype")} if arch == "sm_90a" else set())
    images = [i for i in images if i.variant not in ("wgmma", "y_in_dtype")]
    names = collections.Counter((i.kernel, i.weight_format) for i in images)
    assert names == {("moe_route_quantize", "fp8"): len(moe_aot.MOE_ROUTE_CONFIGS), ("moe_combine", "dense"): 1,
                     ("moe_gate_up", "fp8"): configs, ("moe_gate_up_gated", "fp8"): configs,
                     ("moe_down", "fp8"): configs}
    cap = int(arch.removeprefix("sm_").rstrip("a"))
    for image in images:
        assert image.image.bytes()[:4] == b"\x7fELF" and image.dtype == "bf16" and image.global_scratch_bytes == 0
        assert image.shared_bytes <= _SHARED_KIB[cap] * 1024, (image.kernel, image.variant, image.shared_bytes)
        ops = _sass_ops(image, tmp_path)
        assert ops["LDL"] == ops["STL"] == 0, f"{image.kernel} {image.variant}: registers spill to local memory"
        if cap == 90 and image.weight_format == "fp8" and image.block_m >= 64:
            assert ops["QGMMA"] > 0, f"{image.kernel} {image.variant}: no FP8 wgmma in the sm_90a SASS"


def test_hidden_quantization_divides_exactly():
    """The route launch's quantization of hidden (and, through the same helper, the gate+up epilogue's of h) divides
    with IEEE rounding: Triton's `/` on float32 is div.full.f32, up to 2 ulps off, which put an H100's one-token
    results 4.5e-2 from the FP8 reference (moe_fp8.py). The PTX for sm_90a, compiled here."""
    pytest.importorskip("triton", reason="the MoE kernels are Triton source")
    from et_trt_backend.kernels import aot, moe_fp8

    e_pad, chunk = moe_aot.MOE_ROUTE_CONFIGS["e64"]
    compiled = aot._triton_compile(moe_fp8.moe_fp8_route_kernel, moe_aot.fp8_route_signature("bf16"),
                                   {"CHUNK": chunk, "E_PAD": e_pad, "BLOCK_T": moe_aot.FP8_QUANTIZE_TOKENS}, {}, 90,
                                   moe_aot.FP8_ROUTE_WARPS, 1, aot._FP8_PTX_VERSION.get(90, aot._PTX_VERSION[90]))
    divisions = collections.Counter(re.findall(r"\bdiv\.(\w+)\.f32\b", compiled.asm["ptx"]))
    assert divisions["rn"] > 0 and divisions["full"] == divisions["approx"] == 0, divisions


def test_architectures_without_fp8_are_refused():
    with pytest.raises(ValueError, match="sm_87 has no FP8 tensor cores"):
        moe_aot.moe_experts_images(["sm_87"], "bf16", "fp8")


def test_block_quantization():
    """Each 1 x 128 block's amax becomes 448, zeros stay zeros (scale 1), a partial last block is scaled alone."""
    x = torch.randn(5, 300) * torch.tensor([1e-3, 1.0, 50.0, 0.0, 3.0])[:, None]
    q, scale = moe_experts_fp8.quantize_blocks(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (5, 300) and scale.shape == (5, 3)
    for b in range(3):
        block = slice(128 * b, 128 * (b + 1))
        amax = x[:, block].abs().amax(1)
        assert torch.equal(q[:, block].float().abs().amax(1), torch.where(amax > 0, 448.0, 0.0))
        assert torch.equal(scale[:, b], torch.where(amax > 0, amax / torch.full_like(amax, 448.0), 1.0))
    # e4m3 keeps 3 mantissa bits: each value within 2^-4 of itself (relative), or half its subnormal step (2^-9
    # of the scale) below 2^-6 of it; the zero row exact.
    back = moe_experts_fp8.fake_quantize_blocks(x)
    subnormal_half_step = scale.repeat_interleave(128, 1)[:, :300] * 2**-10
    assert ((back - x).abs() <= x.abs() * 2**-4 + subnormal_half_step).all() and (back[3] == 0).all()


def test_reference_is_the_float32_one_with_quantized_activations():
    """The FP8 reference differs from float32 of the same weights by the activations' e4m3 roundings alone: ~4% on
    random normal inputs, and nothing where every activation is exact in e4m3."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(16, 128, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 4, (16, 2), generator=g, dtype=torch.int32)
    weights = torch.rand(16, 2, generator=g)
    w_gate_up, w_down = torch.randn(4, 256, 128, generator=g) / 12, torch.randn(4, 128, 128, generator=g) / 12
    fp8 = moe_experts_fp8.quantize_weights(w_gate_up.bfloat16(), w_down.bfloat16())
    got = moe_experts_fp8.reference(hidden, ids, weights, *fp8)
    want = moe_experts.reference(hidden.float(), ids, weights, *(moe_experts_fp8.dequantize(*w) for w in fp8))
    err = float((got.float() - want).norm() / want.norm())
    assert 5e-3 < err < 6e-2
    exact = torch.ones(16, 128, dtype=torch.bfloat16)  # every block's amax 1: scale 1/448, q = 448 exactly
    assert torch.equal(moe_experts_fp8.fake_quantize_blocks(exact.float()), exact.float())
    with pytest.raises(ValueError, match="FP8 w_down must be float8_e4m3fn"):
        moe_experts_fp8.reference(hidden, ids, weights, fp8[0], (fp8[1][0].float(), fp8[1][1]))


def test_eager_op_fp8_fake_shapes_and_input_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from et_trt_backend.kernels import moe_op  # noqa: F401 (registers torch.ops.et_trt.moe_experts)

    fp8 = torch.float8_e4m3fn
    with FakeTensorMode():
        hidden = torch.empty(37, 64, dtype=torch.bfloat16)
        ids = torch.empty(37, 2, dtype=torch.int32)
        weights = torch.empty(37, 2)
        w_gate_up, w_down = torch.empty(4, 48, 64, dtype=fp8), torch.empty(4, 64, 24, dtype=fp8)
        scales = torch.empty(4, 48), torch.empty(4, 64)
        out = torch.ops.et_trt.moe_experts(hidden, ids, weights, w_gate_up, w_down, None, None, "swiglu", "concat",
                                           1.702, 7.0, *scales)
        assert out.shape == (37, 64) and out.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="FP8 weights need w_gate_up_scale and w_down_scale"):
            torch.ops.et_trt.moe_experts(hidden, ids, weights, w_gate_up, w_down)
        with pytest.raises(ValueError, match=r"FP8 w_gate_up must be .* float32 scales \[E, out\]"):
            torch.ops.et_trt.moe_experts(hidden, ids, weights, w_gate_up, w_down, None, None, "swiglu", "concat",
                                         1.702, 7.0, torch.empty(4, 24), scales[1])


@pytest.mark.parametrize("split_k", [False, True])
def test_down_candidates_compile(split_k, tmp_path):
    """The FP8 down GEMM's sweep candidates (moe_fp8_down.py) for sm_90a in the "large" tiling with 4 stages
    (benchmarks/device/prepare.py's FP8_DOWN_CANDIDATES): FP8 wgmma, no spills, within shared memory, named as the
    shipped down (the launcher takes them in its place)."""
    pytest.importorskip("triton", reason="the MoE kernels are Triton source")
    large = next(config for config in moe_aot.FP8_GEMM_CONFIGS if config.variant == "large")
    config = dataclasses.replace(large, block_k=64 if split_k else 128, num_stages=4)
    image = moe_aot.fp8_down_candidate_image("sm_90a", "bf16", config, split_k)
    assert (image.kernel, image.variant, image.weight_format) == ("moe_down", "large", "fp8")
    assert image.global_scratch_bytes == 0 and image.shared_bytes <= _SHARED_KIB[90] * 1024, image.shared_bytes
    ops = _sass_ops(image, tmp_path)
    assert ops["LDL"] == ops["STL"] == 0 and ops["QGMMA"] > 0, ops


@pytest.mark.parametrize("stages, step", [(4, 2), (4, 4), (5, 4)])
def test_down_wgmma_candidates_compile(stages, step, tmp_path):
    """The Gluon FP8 down candidates (moe_fp8_down.py's moe_fp8_down_wgmma_kernel; prepare.py's
    FP8_DOWN_WGMMA_CANDIDATES) for sm_90a: no spills, within shared memory, and one wgmma wait per block, not one per
    wgmma instruction (ptxas serializes them where it cannot prove an in-flight accumulator unread, C7514: the
    overlap they exist for would be gone). Their numerics are checked on the device (Gluon has no interpreter)."""
    pytest.importorskip("triton", reason="the MoE kernels are Triton source")
    import triton

    large = next(config for config in moe_aot.FP8_GEMM_CONFIGS if config.variant == "large")
    image = moe_aot.fp8_down_wgmma_image("bf16", dataclasses.replace(large, num_stages=stages), step)
    assert (image.kernel, image.variant, image.arch) == ("moe_down", "large", "sm_90a")
    assert image.global_scratch_bytes == 0 and image.shared_bytes <= _SHARED_KIB[90] * 1024, image.shared_bytes
    ops = _sass_ops(image, tmp_path)
    assert ops["LDL"] == ops["STL"] == 0 and ops["QGMMA"] == 4 * step, ops  # 4 k32 instructions per 128-K block
    path = tmp_path / "down.cubin"
    path.write_bytes(image.image.bytes())
    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    assert sass.count("WARPGROUP.DEPBAR") == step, "wgmma waits: one per block expected"
