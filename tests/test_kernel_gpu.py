"""The grouped-GEMM kernel on a GPU, through the C++ launcher (no Triton in the process).

Runs on the H200 via benchmarks/device/run_all.sh, which builds the launcher and
points ET_TRT_KERNEL_IMAGES at images compiled on the CPU machine. Skipped where
there is no CUDA GPU. The invalid-offset cases also run under
`compute-sanitizer --tool memcheck` there.
"""

import os
import sys

import pytest
import torch
from support.gpu_launchers import launcher_device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (runs on the H200 through benchmarks/device/run_all.sh)"),
]


VARIANTS = ("wgmma", "tma", "tma_small", "tile", "any")  # every path, each on its own launcher
# K and N each variant takes (grouped_mm_launcher.h).
_MULTIPLE = {"wgmma": 8, "tma": 8, "tma_small": 8, "tile": 16, "any": 1}
_variant_launchers = {}


def _launcher(dtype, trans_b, variant=None, weight_format="dense"):
    """The op's launcher (all variants, the launcher picks), or one holding only `variant` (with fp8 weights,
    and the row quantizations)."""
    from et_trt_backend.kernels import launcher, op

    device = launcher_device()
    if variant is None:
        return op._launcher(device, op._DTYPES[dtype], trans_b, weight_format)
    key = (dtype, trans_b, variant, weight_format)
    if key not in _variant_launchers:
        images = op._images_for(device, op._DTYPES[dtype], trans_b, weight_format)
        chosen = [i for i in images if i.variant == variant and i.format == "cubin"]
        if not chosen:
            pytest.skip(f"no {variant} cubin ({weight_format} weights) for this GPU among the images")
        quantize = [i for i in images if i.variant.startswith("quantize_rows")]
        _variant_launchers[key] = launcher.GroupedMMLauncher(chosen + quantize)
    return _variant_launchers[key]


def _reference(a, b, offs, trans_b):
    """Contract 4 in float32: clamped groups, uncovered rows zero."""
    rows = a.shape[0]
    out = torch.zeros(rows, b.shape[1] if trans_b else b.shape[2], dtype=torch.float32, device=a.device)
    start = 0
    for g, raw in enumerate(offs.tolist()):
        end = min(max(raw, start), rows)
        weight = b[g].float().T if trans_b else b[g].float()
        out[start:end] = a[start:end].float() @ weight
        start = end
    return out


def _run(a, b, offs, trans_b, variant=None):
    """Launches into a NaN-poisoned output, so an unwritten element fails the comparison."""
    launcher = _launcher(a.dtype, trans_b, variant)
    rows, k = a.shape
    n = b.shape[1] if trans_b else b.shape[2]
    out = torch.full((rows, n), float("nan"), dtype=a.dtype, device=a.device)
    stream = torch.cuda.current_stream().cuda_stream
    launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, b.shape[0], trans_b, stream)
    torch.cuda.synchronize()
    return out, launcher.last_kernel


def _inputs(rows, k, n, groups, dtype, trans_b, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(rows, k, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    shape = (groups, n, k) if trans_b else (groups, k, n)
    b = (torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen) / k**0.5).to(dtype)
    return a, b


def _routed_offsets(tokens, experts, top_k, seed):
    """Offsets of a random top-k routing: token-expert pairs sorted by expert."""
    gen = torch.Generator().manual_seed(seed)
    choice = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
    counts = torch.bincount(choice, minlength=experts)
    return torch.cumsum(counts, 0).to(torch.int32)


def _assert_matches(out, ref, kernel):
    assert not torch.isnan(out).any(), f"{kernel}: unwritten (NaN-poisoned) outputs remain"
    err = (out.float() - ref).norm() / ref.norm().clamp_min(1e-6)
    assert err < 1e-2, f"{kernel}: relative error {err:.3e}"
    zero_rows = ref.abs().sum(1) == 0
    assert (out[zero_rows] == 0).all(), f"{kernel}: rows outside every group are not zero"


CASES = {
    # name: (rows, K, N, offsets as a function of rows and groups)
    "random_routing": (8 * 64, 256, 384, lambda rows, g: _routed_offsets(64, g, 8, 1)),
    "empty_groups": (300, 128, 256, lambda rows, g: torch.tensor([0, 100, 100, 100, 250, 250, 300, 300][:g], dtype=torch.int32)),
    "all_rows_one_group": (777, 192, 320, lambda rows, g: torch.tensor([0] * (g - 3) + [rows] * 3, dtype=torch.int32)),
    "tail_rows_zeroed": (500, 128, 128, lambda rows, g: torch.linspace(10, 380, g).to(torch.int32)),
    "odd_k_and_n": (333, 100, 77, lambda rows, g: torch.linspace(0, rows, g).to(torch.int32)),
    "k_multiple_of_8": (260, 200, 136, lambda rows, g: torch.linspace(30, rows, g).to(torch.int32)),
    "k_smaller_than_tile": (64, 8, 24, lambda rows, g: torch.tensor([20, 40, 40, 60, 64, 64, 64, 64][:g], dtype=torch.int32)),
}


@pytest.mark.parametrize("variant", [None, *VARIANTS], ids=["picked", *VARIANTS])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_float32_reference(case, dtype, trans_b, variant):
    rows, k, n, make_offs = CASES[case]
    if variant and (k % _MULTIPLE[variant] or n % _MULTIPLE[variant]):
        pytest.skip(f"the {variant} variant does not take K {k}, N {n}")
    groups = 8
    offs = make_offs(rows, groups).cuda()
    a, b = _inputs(rows, k, n, groups, dtype, trans_b, seed=hash((case, str(dtype), trans_b)) % 10_000)
    out, kernel = _run(a, b, offs, trans_b, variant)
    _assert_matches(out, _reference(a, b, offs, trans_b), kernel)


@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
def test_dynamic_rows_one_launcher(trans_b):
    """One launcher, many row counts (a dynamic token dimension), fresh inputs each time."""
    for i, tokens in enumerate([1, 3, 17, 64, 200, 1000, 5]):
        offs = _routed_offsets(tokens, 16, 4, seed=i).cuda()
        a, b = _inputs(tokens * 4, 512, 256, 16, torch.bfloat16, trans_b, seed=100 + i)
        out, kernel = _run(a, b, offs, trans_b)
        _assert_matches(out, _reference(a, b, offs, trans_b), f"{kernel} at {tokens} tokens")


INVALID = {
    "negative": [-5, -1, 40, 90, 128],
    "decreasing": [100, 60, 80, 20, 128],
    "past_rows": [50, 10_000, 200, 2**31 - 1, 2**31 - 1],
    "all_negative": [-(2**31), -7, -7, -1, -1],
    "beyond_then_back": [128, 129, 5000, 7, 0],
    "last_short_of_rows": [3, 90, 150, 200, 250],
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_offsets_are_clamped(case, trans_b, variant):
    """Never out of bounds (checked under compute-sanitizer on the device), and contract 4's result."""
    offs = torch.tensor(INVALID[case], dtype=torch.int32, device="cuda")
    k, n = {"wgmma": (136, 264), "tma": (136, 264), "tma_small": (136, 264), "tile": (144, 272), "any": (30, 50)}[variant]  # K, N past a tile multiple
    a, b = _inputs(300, k, n, 5, torch.bfloat16, trans_b, seed=7)
    out, kernel = _run(a, b, offs, trans_b, variant)
    _assert_matches(out, _reference(a, b, offs, trans_b), f"{kernel} ({case}, K {k}, N {n})")


def test_wgmma_invalid_offsets_many_groups():
    """The wgmma kernel clamps the offsets with block-wide scans over all groups: 1,000 groups (more
    than its 384 threads, so each thread takes several) whose offsets mix valid runs with negative
    and slightly decreasing values throughout and values past the rows in the last tenth; drawn fresh each run."""
    seed = int(torch.randint(0, 2**31 - 1, ()))
    gen = torch.Generator().manual_seed(seed)
    rows, groups = 3000, 1000
    offs = torch.sort(torch.randint(0, rows, (groups,), generator=gen)).values
    pick = torch.rand(groups, generator=gen)
    offs = torch.where(pick < 0.05, -torch.randint(1, 2**31 - 1, (groups,), generator=gen), offs)
    offs = torch.where((pick >= 0.05) & (pick < 0.1), offs - torch.randint(1, 60, (groups,), generator=gen), offs)
    past = (pick >= 0.1) & (pick < 0.3) & (torch.arange(groups) >= 900)
    offs = torch.where(past, torch.randint(rows, 2**31 - 1, (groups,), generator=gen), offs)
    offs = offs.to(torch.int32).cuda()
    a, b = _inputs(rows, 64, 136, groups, torch.bfloat16, True, seed=seed)
    out, kernel = _run(a, b, offs, True, "wgmma")
    _assert_matches(out, _reference(a, b, offs, True), f"{kernel} (seed {seed})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_wgmma_every_tile_width(dtype):
    """Groups of 5 to 253 rows (every width 8..256 of grouped_mm_sm90.cu) and groups split in 2 and 3 tiles."""
    sizes = [8 * i - 3 for i in range(1, 33)] + [257, 600, 1, 0]
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32).cuda()
    rows = int(offs[-1]) + 5  # 5 tail rows
    a, b = _inputs(rows, 192, 136, len(sizes), dtype, True, seed=21)
    out, kernel = _run(a, b, offs, True, "wgmma")
    _assert_matches(out, _reference(a, b, offs, True), kernel)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_wgmma_long_k_many_tiles_per_cta(dtype):
    """K of 1,000 (16 stage loads per tile, more than the ring holds) and ~15 tiles per cluster:
    the ring's phases over many rounds and tiles, as at the MoE shapes (small tests never wrap it)."""
    offs = _routed_offsets(1000, 64, 4, seed=31).cuda()  # 4,000 rows in 64 groups of ~62
    a, b = _inputs(4000, 1000, 2048, 64, dtype, True, seed=32)
    out, kernel = _run(a, b, offs, True, "wgmma")
    _assert_matches(out, _reference(a, b, offs, True), kernel)


def test_wgmma_descriptors_follow_buffers_and_sizes():
    """The launcher keeps the TMA descriptors of its last 8 wgmma calls and reuses them when a, b
    and the sizes repeat. Ten slices of one buffer (more calls than it keeps), twice, with new
    contents the second time, then the first call's pointers read with another K: each call must
    read exactly what it is given."""
    rows, k, n, groups = 512, 256, 384, 16
    base, b = _inputs(rows + 9 * 64, k, n, groups, torch.bfloat16, True, seed=41)
    offs = _routed_offsets(rows // 4, groups, 4, seed=42).cuda()
    for round_ in range(2):
        base.copy_(torch.randn(base.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(43 + round_)))
        for i in range(10):
            a = base[i * 64:i * 64 + rows]
            out, kernel = _run(a, b, offs, True, "wgmma")
            _assert_matches(out, _reference(a, b, offs, True), f"{kernel} (round {round_}, slice {i})")
    # The first call's pointers and rows, K halved: only K tells the calls apart.
    a = base.view(-1)[:rows * (k // 2)].view(rows, k // 2)
    narrow_b = b.view(-1)[:groups * n * (k // 2)].view(groups, n, k // 2)
    out, kernel = _run(a, narrow_b, offs, True, "wgmma")
    _assert_matches(out, _reference(a, narrow_b, offs, True), f"{kernel} (K {k // 2})")


def test_more_groups_than_the_wgmma_table_falls_back():
    """The wgmma kernel holds sm90.MAX_GROUPS groups: with more, the launcher picks the next variant, still correct."""
    from et_trt_backend.kernels import op, sm90

    _launcher(torch.bfloat16, True)  # skips like the others where nothing can run
    device = torch.device("cuda", torch.cuda.current_device())
    if torch.cuda.get_device_capability(device) != (9, 0) or not any(
            i.variant == "wgmma" for i in op._images_for(device, "bf16", True)):
        pytest.skip("the wgmma kernel serves sm_90 only, and only where its image was built (nvcc)")
    for experts, picked_wgmma in ((sm90.MAX_GROUPS + 76, False), (sm90.MAX_GROUPS, True)):
        offs = _routed_offsets(9000, experts, 8, seed=9).cuda()  # 72,000 rows: >= 64 per group
        a, b = _inputs(72_000, 64, 64, experts, torch.bfloat16, True, seed=10)
        out, kernel = _run(a, b, offs, True)
        assert kernel.startswith("grouped_mm_wgmma") == picked_wgmma, (experts, kernel)
        _assert_matches(out, _reference(a, b, offs, True), kernel)


def test_eager_op_matches_torch_grouped_mm():
    """torch.ops.et_trt.grouped_mm agrees with torch._grouped_mm on valid offsets, and zeroes the tail."""
    from et_trt_backend.kernels import op  # noqa: F401 (registers the op)

    _launcher(torch.bfloat16, True)
    offs = _routed_offsets(100, 8, 2, seed=3).cuda()
    rows = int(offs[-1]) + 16  # 16 tail rows
    a, w = _inputs(rows, 256, 512, 8, torch.bfloat16, True, seed=4)
    out = torch.ops.et_trt.grouped_mm(a, w, offs, True)
    ref = torch._grouped_mm(a, w.transpose(-2, -1), offs)
    used = int(offs[-1])
    torch.testing.assert_close(out[:used].float(), ref[:used].float(), rtol=2e-2, atol=2e-2)
    assert (out[used:] == 0).all()


def test_errors_are_clear():
    from et_trt_backend.kernels import op
    from et_trt_backend.kernels.launcher import LauncherError

    launcher = _launcher(torch.bfloat16, False)
    a, b = _inputs(16, 32, 32, 2, torch.bfloat16, False, seed=0)
    offs = torch.tensor([8, 16], dtype=torch.int32, device="cuda")
    with pytest.raises(LauncherError, match="trans_b"):
        launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), a.data_ptr(), 16, 32, 32, 2, True, 0)
    with pytest.raises(LauncherError, match="16-byte aligned"):
        launcher.launch(a.data_ptr() + 2, b.data_ptr(), offs.data_ptr(), a.data_ptr(), 16, 32, 32, 2, False, 0)
    with pytest.raises(LauncherError, match="32-bit indexing"):
        launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), a.data_ptr(), 2**31, 32, 32, 2, False, 0)
    with pytest.raises(LauncherError, match="negative size"):
        launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), a.data_ptr(), -1, 32, 32, 2, False, 0)
    with pytest.raises(ValueError, match="offs must be int32"):
        op.grouped_mm(a, b, offs.long(), False)


@pytest.mark.parametrize("k, groups", [(0, 3), (64, 0)], ids=["k_zero", "no_groups"])
def test_no_products_writes_zeros(k, groups):
    """K = 0 or no groups: every row is zero (a zero fill, no kernel)."""
    a, b = _inputs(50, max(k, 1), 40, max(groups, 1), torch.bfloat16, False, seed=5)
    a, b = a[:, :k].contiguous(), b[:groups, :k].contiguous()
    offs = torch.tensor([20, 40, 50][:groups], dtype=torch.int32, device="cuda")
    if groups == 0:
        offs = torch.zeros(1, dtype=torch.int32, device="cuda")[:0]
    out, kernel = _run(a, b, offs, False)
    assert kernel == "memset" and (out == 0).all()


def test_no_triton_in_this_process():
    """The device run checks the shipped images exactly as the robot runs them: without Triton."""
    if not os.environ.get("ET_TRT_KERNEL_IMAGES"):
        pytest.skip("images compiled in this process (ET_TRT_KERNEL_IMAGES unset)")
    assert "triton" not in sys.modules, "Triton was imported by the process that ran the checks"


def test_portable_ptx_runs_when_no_cubin_serves():
    """The sm_80 PTX images alone: the driver JIT-compiles them for this GPU."""
    from et_trt_backend.kernels import aot, images, op
    from et_trt_backend.kernels.launcher import GroupedMMLauncher

    _launcher(torch.bfloat16, True)  # skips like the others where nothing can run
    if os.environ.get(op.IMAGES_ENV):
        pool = images.load_images(os.environ[op.IMAGES_ENV])
    else:
        pool = aot.grouped_mm_images([], "bf16", True)
    ptx = [i for i in pool if i.format == "ptx" and i.dtype == "bf16" and i.trans_b]
    assert ptx, "no PTX image among the shipped images"
    launcher = GroupedMMLauncher(ptx)
    offs = torch.tensor([30, 30, 90, 120], dtype=torch.int32, device="cuda")
    a, b = _inputs(128, 64, 96, 4, torch.bfloat16, True, seed=11)
    out = torch.full((128, 96), float("nan"), dtype=torch.bfloat16, device="cuda")
    launcher.launch(a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), 128, 64, 96, 4, True,
                    torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    _assert_matches(out, _reference(a, b, offs, True), launcher.last_kernel)


# FP8 weights (grouped_mm_launcher.h): b e4m3 [G, N, K] with b_scale [G, N], the rows quantized on the GPU.
FP8_VARIANTS = ("wgmma", "tma", "tma_small", "any")
_FP8_MULTIPLE = {"wgmma": (16, 8), "tma": (16, 16), "tma_small": (16, 16), "any": (1, 1)}  # K, N


def _fp8_inputs(rows, k, n, groups, dtype, seed):
    from et_trt_backend.quantization import quantize_weights_fp8

    a, w = _inputs(rows, k, n, groups, dtype, True, seed)
    b_q, b_scale = quantize_weights_fp8(w)
    return a, b_q, b_scale


def _fp8_run(a, b_q, b_scale, offs, variant=None, swiglu=False):
    """Launches into a NaN-poisoned output and a NaN-poisoned workspace (0xff is NaN in e4m3 and in float32),
    so an unwritten output or a quantized row read before it is written fails the comparison. Returns
    (out, the workspace, "<its row quantization> + <its GEMM>"). swiglu: a is a gate+up output [rows, 2K]."""
    from et_trt_backend.kernels.launcher import Fp8Operands, fp8_workspace_bytes

    launcher = _launcher(a.dtype, True, variant, "fp8")
    rows, k = a.shape[0], b_q.shape[2]
    n = b_q.shape[1]
    out = torch.full((rows, n), float("nan"), dtype=a.dtype, device=a.device)
    workspace = torch.full((fp8_workspace_bytes(rows, k),), 0xFF, dtype=torch.uint8, device=a.device)
    launcher.launch(a.data_ptr(), b_q.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, b_q.shape[0], True,
                    torch.cuda.current_stream().cuda_stream,
                    Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), workspace.numel(), swiglu))
    torch.cuda.synchronize()
    return out, workspace, f"{launcher.last_quantize} + {launcher.last_kernel}"


def _assert_fp8_matches(out, a, b_q, b_scale, offs, kernel):
    """Within 1e-2 of the float64 product of the same quantized operands (contract 4's groups), and within
    4e-2 of the float32 product of the unquantized activations with the dequantized weights."""
    from et_trt_backend.quantization import grouped_mm_fp8_reference

    _assert_matches(out, grouped_mm_fp8_reference(a, b_q, b_scale, offs), kernel)
    dequantized = b_q.float() * b_scale[..., None]
    ref = _reference(a.float(), dequantized, offs, True)
    err = (out.float() - ref).norm() / ref.norm().clamp_min(1e-6)
    assert err < 4e-2, f"{kernel}: relative error {err:.3e} against the unquantized activations"


@pytest.mark.parametrize("variant", [None, *FP8_VARIANTS], ids=["picked", *FP8_VARIANTS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_fp8_matches_float32_reference(case, dtype, variant):
    rows, k, n, make_offs = CASES[case]
    if variant and (k % _FP8_MULTIPLE[variant][0] or n % _FP8_MULTIPLE[variant][1]):
        pytest.skip(f"the fp8 {variant} variant does not take K {k}, N {n}")
    groups = 8
    offs = make_offs(rows, groups).cuda()
    a, b_q, b_scale = _fp8_inputs(rows, k, n, groups, dtype, seed=hash((case, str(dtype), "fp8")) % 10_000)
    out, _, kernel = _fp8_run(a, b_q, b_scale, offs, variant)
    _assert_fp8_matches(out, a, b_q, b_scale, offs, kernel)


@pytest.mark.parametrize("k", [256, 200, 3072, 77], ids=["k256", "k200", "k3072", "odd_k77"])
def test_fp8_row_quantization_is_the_reference_bit_for_bit(k):
    """The quantized rows and their scales the launcher leaves in the workspace are quantize_rows_fp8's exactly
    (K % 16 == 0 takes the vectorized kernel, the others quantize_rows_any); rows of zeros scale by 1."""
    from et_trt_backend.quantization import quantize_rows_fp8

    rows = 300
    offs = torch.tensor([100, 200, 300], dtype=torch.int32, device="cuda")
    a, b_q, b_scale = _fp8_inputs(rows, k, 64, 3, torch.bfloat16, seed=k)
    a[7] = 0
    a[8] *= 1e-30  # subnormal scale territory in float32 stays exact
    _, workspace, _ = _fp8_run(a, b_q, b_scale, offs)
    a_q, a_scale = quantize_rows_fp8(a)
    scale_at = (rows * k + 255) // 256 * 256
    assert torch.equal(workspace[:rows * k].view(rows, k), a_q.view(torch.uint8))
    assert torch.equal(workspace[scale_at:scale_at + 4 * rows].view(torch.float32), a_scale)
    assert a_scale[7] == 1


def _gate_up_output(rows, k, dtype, seed):
    """x [rows, 2K] as a gate+up GEMM leaves it, with a row of zeros, a row of tiny values, and wide magnitudes
    (silu saturates and underflows)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, 2 * k, device="cuda", generator=g) * torch.logspace(-3, 1.5, rows, device="cuda")[:, None]
    x = x.to(dtype)
    x[min(7, rows - 1)] = 0
    x[min(8, rows - 1)] *= 1e-4
    return x


# Each SwiGLU row quantization the launcher picks: (rows, K). The whole-row one takes every K up to its block.
_SWIGLU_PATHS = {"quantize_rows_swiglu_whole": [(300, 256), (1000, 3072)], "quantize_rows_swiglu": [(300, 8192)],
                 "quantize_rows_swiglu_any": [(300, 77)]}


@pytest.mark.parametrize("path", list(_SWIGLU_PATHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_swiglu_rows_are_quantized_as_the_reference(dtype, path):
    """With a gate+up output as a, the rows left quantized in the workspace are quantize_rows_fp8 of
    swiglu_rows(a) (PyTorch on the GPU) up to the kernel's sigmoid: its float32 result a few ulps off
    PyTorch's may round an SwiGLU value to the neighbouring bf16/fp16 value, and so move its row's scale by
    up to one ulp of the dtype and a quantized value by up to one e4m3 step; few do. The GEMM's result is the
    FP8 reference's of that SwiGLU."""
    from et_trt_backend.quantization import quantize_rows_fp8, swiglu_rows

    for rows, k in _SWIGLU_PATHS[path]:
        x = _gate_up_output(rows, k, dtype, seed=k)
        _, b_q, b_scale = _fp8_inputs(1, k, 72, 3, dtype, seed=k + 1)
        offs = torch.tensor([rows // 3, rows // 3, rows], dtype=torch.int32, device="cuda")
        out, workspace, kernel = _fp8_run(x, b_q, b_scale, offs, swiglu=True)
        assert kernel.startswith(path + " "), f"{rows} rows of K {k} took {kernel}, not {path}"
        h = swiglu_rows(x)
        a_q, a_scale = quantize_rows_fp8(h)
        scale_at = (rows * k + 255) // 256 * 256
        got_scale = workspace[scale_at:scale_at + 4 * rows].view(torch.float32)
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
        torch.testing.assert_close(got_scale, a_scale, rtol=ulp, atol=0)
        assert got_scale[7] == 1  # the row of zeros
        got_q = workspace[:rows * k].view(rows, k)
        differ = (got_q != a_q.view(torch.uint8)).float().mean().item()
        assert differ < 0.02, f"{kernel}: {differ:.2%} of the quantized values differ from the reference's"
        got = got_q.view(torch.float8_e4m3fn).float() * got_scale[:, None]
        want = a_q.float() * a_scale[:, None]
        step = 2.0**-3 * want.abs() + 2.0**-9 * a_scale[:, None]  # one e4m3 step, normal or subnormal
        assert ((got - want).abs() <= step * (1 + ulp) + 1e-30).all(), f"{kernel}: a value off by more than a step"
        _assert_fp8_matches(out, h, b_q, b_scale, offs, kernel)


@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp8_gemms_take_a_gate_up_output(variant):
    """Each fp8 GEMM variant behind the SwiGLU row quantization, at K and N it takes, groups empty and clamped."""
    from et_trt_backend.quantization import swiglu_rows

    k, n = {"wgmma": (192, 264), "tma": (192, 272), "tma_small": (192, 272), "any": (30, 50)}[variant]
    x = _gate_up_output(500, k, torch.bfloat16, seed=41)
    _, b_q, b_scale = _fp8_inputs(1, k, n, 5, torch.bfloat16, seed=42)
    offs = torch.tensor([0, 120, 120, 400, 450], dtype=torch.int32, device="cuda")
    out, _, kernel = _fp8_run(x, b_q, b_scale, offs, variant, swiglu=True)
    _assert_fp8_matches(out, swiglu_rows(x), b_q, b_scale, offs, kernel)
    assert (out[450:] == 0).all()  # rows past the last group


def test_fp8_launcher_without_swiglu_images_refuses_a_gate_up_output():
    from et_trt_backend.kernels import launcher, op
    from et_trt_backend.kernels.launcher import Fp8Operands

    _launcher(torch.bfloat16, True, None, "fp8")  # the CUDA context, or the test's skip
    device = torch.device("cuda", torch.cuda.current_device())
    images = [i for i in op._images_for(device, op._DTYPES[torch.bfloat16], True, "fp8") if "swiglu" not in i.variant]
    plain = launcher.GroupedMMLauncher(images)
    x = _gate_up_output(16, 64, torch.bfloat16, seed=3)
    _, b_q, b_scale = _fp8_inputs(1, 64, 32, 2, torch.bfloat16, seed=4)
    offs = torch.tensor([8, 16], dtype=torch.int32, device="cuda")
    out = torch.empty(16, 32, dtype=torch.bfloat16, device="cuda")
    workspace = torch.empty(launcher.fp8_workspace_bytes(16, 64), dtype=torch.uint8, device="cuda")
    with pytest.raises(launcher.LauncherError, match=r"needs the \"quantize_rows_swiglu\" images.*re-export"):
        plain.launch(x.data_ptr(), b_q.data_ptr(), offs.data_ptr(), out.data_ptr(), 16, 64, 32, 2, True,
                     torch.cuda.current_stream().cuda_stream,
                     Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), workspace.numel(), True))


def _every_mantissa_pair(dtype, exponents, max_values):
    """Rows that meet every pair of mantissas a quotient a / a_scale can: for each value A of dtype in the binades
    2^e (e in exponents), every value of dtype from A * 2^-26 up to A (smaller ones quotient below e4m3's least),
    in rows of at most max_values of them, each row holding A too, with both signs, +0 and -0; zero-padded to one
    length. float32, on the CPU."""
    every = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    every = every[torch.isfinite(every)]  # each non-negative finite value once
    rows = []
    for e in exponents:
        for amax in every[(every >= 2.0**e) & (every < 2.0**(e + 1))]:
            for piece in every[(every < amax) & (every >= amax * 2.0**-26)].split(max_values - 1):
                piece = torch.cat([piece, amax.view(1)])
                rows.append(torch.cat([piece, -piece, torch.tensor([0.0, -0.0])]))
    k = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, k - len(r))) for r in rows])


# bf16: 2^0, the top binade, both sides of the lifted rows' bound (scale 2^-64: amax 2^-55.2), a subnormal
# scale (amax 2^-126) and subnormal amax. fp16: 2^0, the top, the least normal and a subnormal binade.
_PAIR_EXPONENTS = {torch.bfloat16: [0, 127, -56, -55, -126, -130], torch.float16: [0, 15, -14, -20]}
# Each row quantization the launcher picks: (K beyond a multiple of 16, values per row at most, rows per launch).
# The whole-row one serves launches of at most 2^21 elements with K <= 4096.
_QUANTIZE_PATHS = {"quantize_rows": (0, 1 << 20, None), "quantize_rows_whole": (0, 2047, 512),
                   "quantize_rows_any": (5, 1 << 20, None)}


@pytest.mark.parametrize("path", list(_QUANTIZE_PATHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_row_quantization_is_ieee_division_for_every_mantissa_pair(dtype, path):
    """Each row quantization's quotients (a correction on x * RN(1/s), no division) are IEEE division's, bit for
    bit, over every pair of bf16 or fp16 mantissas, subnormal values and scales included."""
    from et_trt_backend.quantization import quantize_rows_fp8

    extra, max_values, rows_per_launch = _QUANTIZE_PATHS[path]
    every = _every_mantissa_pair(dtype, _PAIR_EXPONENTS[dtype], max_values)
    k = -(-every.shape[1] // 16) * 16 + extra
    every = torch.nn.functional.pad(every, (0, k - every.shape[1])).to(dtype).cuda()
    _, b_q, b_scale = _fp8_inputs(1, k, 16, 1, dtype, seed=5)
    for a in every.split(rows_per_launch or len(every)):
        rows = len(a)
        _, workspace, kernel = _fp8_run(a, b_q, b_scale, torch.tensor([rows], dtype=torch.int32, device="cuda"))
        assert kernel.startswith(path + " "), f"{rows} rows of K {k} took {kernel}, not {path}"
        a_q, a_scale = quantize_rows_fp8(a)
        scale_at = (rows * k + 255) // 256 * 256
        assert torch.equal(workspace[scale_at:scale_at + 4 * rows].view(torch.float32), a_scale)
        got, want = workspace[:rows * k].view(rows, k), a_q.view(torch.uint8)
        bad = (got != want).nonzero()
        examples = [(float(a[r].abs().max()), float(a[r, c]), int(got[r, c]), int(want[r, c]))
                    for r, c in bad[:5].tolist()]
        assert len(bad) == 0, f"{kernel}: {len(bad)} of {rows * k} values differ (row amax, x, got, want): {examples}"


def test_fp8_dynamic_rows_one_launcher():
    """One fp8 launcher, many row counts, fresh inputs each time."""
    for i, tokens in enumerate([1, 3, 17, 64, 200, 1000, 5]):
        offs = _routed_offsets(tokens, 16, 4, seed=i).cuda()
        a, b_q, b_scale = _fp8_inputs(tokens * 4, 512, 256, 16, torch.bfloat16, seed=200 + i)
        out, _, kernel = _fp8_run(a, b_q, b_scale, offs)
        _assert_fp8_matches(out, a, b_q, b_scale, offs, f"{kernel} at {tokens} tokens")


@pytest.mark.parametrize("variant", FP8_VARIANTS)
@pytest.mark.parametrize("case", list(INVALID))
def test_fp8_invalid_offsets_are_clamped(case, variant):
    """Never out of bounds (compute-sanitizer on the device), and contract 4's result, with fp8 weights."""
    offs = torch.tensor(INVALID[case], dtype=torch.int32, device="cuda")
    k, n = {"wgmma": (144, 264), "tma": (144, 272), "tma_small": (144, 272), "any": (30, 50)}[variant]
    a, b_q, b_scale = _fp8_inputs(300, k, n, 5, torch.bfloat16, seed=8)
    out, _, kernel = _fp8_run(a, b_q, b_scale, offs, variant)
    _assert_fp8_matches(out, a, b_q, b_scale, offs, f"{kernel} ({case}, K {k}, N {n})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_wgmma_every_tile_width(dtype):
    """The fp8 wgmma kernel at every width 8..256 (its row scales come by shuffle from 32-row blocks) and
    groups split in 2 and 3 tiles, with N not a multiple of the 128-feature tile."""
    sizes = [8 * i - 3 for i in range(1, 33)] + [257, 600, 1, 0]
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32).cuda()
    rows = int(offs[-1]) + 5
    a, b_q, b_scale = _fp8_inputs(rows, 192, 136, len(sizes), dtype, seed=22)
    out, _, kernel = _fp8_run(a, b_q, b_scale, offs, "wgmma")
    _assert_fp8_matches(out, a, b_q, b_scale, offs, kernel)


def test_fp8_wgmma_long_k_many_tiles_per_cta():
    """K of 3072 (24 stage loads of 128 per tile, the ring wraps many times) at an MoE-like routing, the
    accumulation over the whole K in the tensor cores' fp8 accumulators."""
    offs = _routed_offsets(1000, 64, 4, seed=33).cuda()
    a, b_q, b_scale = _fp8_inputs(4000, 3072, 2048, 64, torch.bfloat16, seed=34)
    out, _, kernel = _fp8_run(a, b_q, b_scale, offs, "wgmma")
    _assert_fp8_matches(out, a, b_q, b_scale, offs, kernel)


def test_fp8_eager_op_matches_torch_scaled_grouped_mm():
    """torch.ops.et_trt.grouped_mm's fp8 form agrees with torch._scaled_grouped_mm on the same quantized
    operands and row-wise scales, and zeroes the tail rows."""
    from et_trt_backend.kernels import op  # noqa: F401 (registers the op)
    from et_trt_backend.quantization import quantize_rows_fp8

    _launcher(torch.bfloat16, True, weight_format="fp8")
    if not hasattr(torch, "_scaled_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _scaled_grouped_mm")
    offs = _routed_offsets(100, 8, 2, seed=5).cuda()
    rows = int(offs[-1]) + 16
    a, b_q, b_scale = _fp8_inputs(rows, 256, 512, 8, torch.bfloat16, seed=6)
    out = torch.ops.et_trt.grouped_mm(a, b_q, offs, True, b_scale)
    a_q, a_scale = quantize_rows_fp8(a)
    ref = torch._scaled_grouped_mm(a_q, b_q.transpose(-2, -1), a_scale, b_scale, offs=offs, out_dtype=torch.bfloat16)
    used = int(offs[-1])
    torch.testing.assert_close(out[:used].float(), ref[:used].float(), rtol=2e-2, atol=2e-2)
    assert (out[used:] == 0).all()


def test_fp8_errors_are_clear():
    from et_trt_backend.kernels.launcher import (
        Fp8Operands,
        LauncherError,
        fp8_workspace_bytes,
    )

    fp8 = _launcher(torch.bfloat16, True, weight_format="fp8")
    dense = _launcher(torch.bfloat16, True)
    rows, k, n = 16, 32, 32
    a, b_q, b_scale = _fp8_inputs(rows, k, n, 2, torch.bfloat16, seed=0)
    offs = torch.tensor([8, 16], dtype=torch.int32, device="cuda")
    out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    need = fp8_workspace_bytes(rows, k)
    assert need == (rows * k + 255) // 256 * 256 + 4 * rows
    workspace = torch.empty(need + 256, dtype=torch.uint8, device="cuda")
    args = (a.data_ptr(), b_q.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, 2, True, 0)
    with pytest.raises(LauncherError, match="take fp8 weights; pass b as float8 e4m3"):
        fp8.launch(*args)
    with pytest.raises(LauncherError, match="dense weights"):
        dense.launch(*args, Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), need))
    with pytest.raises(LauncherError, match=f"workspace of fp8_workspace_bytes\\(rows, k\\) = {need} bytes"):
        fp8.launch(*args, Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), need - 1))
    with pytest.raises(LauncherError, match="256-byte aligned"):
        fp8.launch(*args, Fp8Operands(b_scale.data_ptr(), workspace.data_ptr() + 16, need))
    with pytest.raises(LauncherError, match="b_scale"):
        fp8.launch(*args, Fp8Operands(0, workspace.data_ptr(), need))
    with pytest.raises(ValueError, match="fp8 weights are b float8_e4m3fn"):
        torch.ops.et_trt.grouped_mm(a, b_q, offs, False, b_scale)
