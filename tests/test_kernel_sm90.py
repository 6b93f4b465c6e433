"""The hand-written sm_90a kernel (grouped_mm_sm90.cu) on the CPU machine: the generated
wgmma statements, the nvcc build, its SASS and its shared-memory budget. It runs on
the H200 in tests/test_kernel_gpu.py (variant "wgmma")."""

import collections
import os
import re
import subprocess

import pytest

from et_trt_backend.kernels import aot, parallel_compile, sm90

needs_nvcc = pytest.mark.skipif(sm90.nvcc_path() is None, reason="nvcc (CUDA toolkit) is not installed here")


@pytest.mark.parametrize("dtype, weight_format, instruction, immediates", [
    ("bf16", "dense", "k16.f32.bf16.bf16", "1, 1, 1, 0, 0"),
    ("fp16", "dense", "k16.f32.f16.f16", "1, 1, 1, 0, 0"),
    ("bf16", "fp8", "k32.f32.e4m3.e4m3", "1, 1, 1"),  # e4m3 has no transpose immediates: both K-major
])
def test_generated_wgmma_statements_cover_every_width(dtype, weight_format, instruction, immediates):
    header = sm90.wgmma_header(dtype, weight_format)
    widths = [int(w) for w in re.findall(rf"m64n(\d+){re.escape(instruction)}", header)]
    assert widths == list(range(8, 257, 8))
    for width in widths:
        # One "+f" accumulator operand per pair of output elements a thread holds.
        body = header.split(f"wgmma_m64<{width}>(float (&acc)[{width // 2}]")[1].split("}\n", 1)[0]
        assert body.count('"+f"') == width // 2
        assert f"%{width // 2}, %{width // 2 + 1}, {immediates};" in body


def test_shared_memory_fits_hopper():
    assert sm90.shared_bytes(sm90.STAGES) <= 227 * 1024
    assert sm90.shared_bytes(sm90.FP8_DOWN_STAGES, sm90.max_width("fp8", "down")) <= 227 * 1024


def _sass(cubin: bytes, tmp_path) -> str:
    from triton.backends.nvidia.compiler import get_ptxas  # cuobjdump ships next to Triton's ptxas

    path = tmp_path / "wgmma.cubin"
    path.write_bytes(cubin)
    cuobjdump = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    return subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout


def _k_loops(sass: str) -> list[list[str]]:
    """The SASS of each loop that issues wgmma (a backward branch over at most 400 instructions): the K loops."""
    lines = [line for line in sass.splitlines() if re.match(r"^\s+/\*[0-9a-f]{4,}\*/\s", line)]
    at = {int(re.match(r"^\s+/\*([0-9a-f]+)\*/", line).group(1), 16): i for i, line in enumerate(lines)}
    loops = []
    for i, line in enumerate(lines):
        branch = re.search(r"\bBRA (0x[0-9a-f]+)", line)
        start = at.get(int(branch.group(1), 16)) if branch else None
        if start is not None and i - 400 < start < i and any("GMMA" in x for x in lines[start:i]):
            loops.append(lines[start:i + 1])
    return loops


@needs_nvcc
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cubin_uses_wgmma_tma_and_stmatrix(dtype, tmp_path):
    pytest.importorskip("triton", reason="cuobjdump comes with Triton here")
    image = sm90.image(dtype)
    assert image.kernel == "grouped_mm_wgmma_nk" and image.entry == sm90.ENTRY and image.arch == "sm_90a"
    assert image.image.bytes()[:4] == b"\x7fELF" and image.num_warps == 12
    assert (image.block_m, image.block_n) == (sm90.MAX_WIDTH, sm90.TILE_FEATURES)
    sass = _sass(image.image.bytes(), tmp_path)
    # cuobjdump names the input type for bf16 only: "HGMMA.64x224x16.F32.BF16", fp16 "HGMMA.64x224x16.F32".
    shapes = collections.Counter(re.findall(r"HGMMA\.64x(\d+)x16\.F32(\.BF16)?\s", sass))
    kind = ".BF16" if dtype == "bf16" else ""
    assert {int(n) for n, k in shapes if k == kind} == set(range(8, 257, 8)), "a tile width has no wgmma"
    for op in ("UTMALDG.2D", "UTMALDG.3D", "STSM", "SYNCS", "USETMAXREG"):
        assert op in sass, f"{op} missing from the SASS"
    if sm90.CLUSTER > 1:  # the rows multicast to the cluster, whose CTAs meet at a cluster barrier at start
        assert "UTMALDG.2D.MULTICAST" in sass and "UCGABAR_WAIT" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spill to local memory"


@needs_nvcc
def test_fp8_cubin_uses_fp8_wgmma_at_every_width(tmp_path):
    pytest.importorskip("triton", reason="cuobjdump comes with Triton here")
    image = sm90.image("bf16", weight_format="fp8")
    assert image.kernel == "grouped_mm_wgmma_fp8_nk" and image.weight_format == "fp8" and image.dtype == "bf16"
    assert image.block_k == 128  # 128 bytes of e4m3 per stage row, as 64 16-bit elements
    sass = _sass(image.image.bytes(), tmp_path)
    # It waits for the row quantization before it (griddepcontrol.wait) and its image says so: GroupedMMLauncher
    # starts it during the quantization only then; the 16-bit builds neither wait nor say so.
    assert image.waits_for_prior_grid and "ACQBULK" in sass
    assert not sm90.image("bf16").waits_for_prior_grid and not sm90.image("bf16", moe="down").waits_for_prior_grid
    widths = {int(n) for n in re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3\s", sass)}
    assert widths == set(range(8, 257, 8)), "a tile width has no e4m3 wgmma"
    assert "HGMMA" not in sass and "UTMALDG.2D.MULTICAST" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spill to local memory"


@needs_nvcc
@pytest.mark.parametrize("moe, kernel, staged", [("gate_up", "moe_gate_up_gated", True), ("down", "moe_down", False)])
def test_moe_cubins_use_wgmma_at_every_width(moe, kernel, staged, tmp_path):
    """The MoE experts op's builds (ET_TRT_MOE): the same pipeline at every tile width; the gate+up epilogue stages
    through stmatrix, the down one stores its float32 rows straight out."""
    pytest.importorskip("triton", reason="cuobjdump comes with Triton here")
    image = sm90.image("bf16", moe=moe)
    assert (image.kernel, image.variant, image.arch) == (kernel, "wgmma", "sm_90a")
    assert (image.block_m, image.block_n) == (sm90.MAX_WIDTH, sm90.TILE_FEATURES)
    sass = _sass(image.image.bytes(), tmp_path)
    widths = {int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16\.F32\.BF16\s", sass)}
    assert widths == set(range(8, 257, 8)), "a tile width has no wgmma"
    assert "UTMALDG.2D.MULTICAST" in sass and ("STSM" in sass) == staged
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spill to local memory"
    # An epilogue runs once a tile, its code fetched again each time: the gate+up's activations unrolled per
    # accumulator element made 146,736 instructions and cost the GEMM a quarter of its time
    # (benchmarks/results/h100_gate_up_epilogue/); rolled, 63,264. The down build's: 59,416 unstaged, 21,672 staged.
    instructions = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s", sass, re.M))
    assert instructions < 80_000, f"{instructions} SASS instructions: an epilogue unrolled per element?"


@needs_nvcc
def test_fp8_moe_gate_up_cubin_quantizes_across_its_cluster(tmp_path):
    """The FP8 MoE gate+up (ET_TRT_FP8 with ET_TRT_MOE=1): e4m3 wgmma at tile widths 8-224, its epilogue writing
    e4m3 h with the amaxes exchanged by st.async between the cluster's two CTAs; it needs clusters of two."""
    pytest.importorskip("triton", reason="cuobjdump comes with Triton here")
    image = sm90.image("bf16", weight_format="fp8", moe="gate_up")
    assert (image.kernel, image.variant, image.weight_format, image.block_k) == ("moe_gate_up_gated", "wgmma", "fp8", 128)
    assert image.waits_for_prior_grid and not image.y_in_dtype
    assert image.shared_bytes == sm90.shared_bytes(sm90.STAGES, 224, amax_exchange=True) <= 227 * 1024
    sass = _sass(image.image.bytes(), tmp_path)
    widths = {int(n) for n in re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3\s", sass)}
    assert widths == set(range(8, 225, 8)), sorted(widths)
    assert "HGMMA" not in sass and "UTMALDG.2D.MULTICAST" in sass
    assert "STAS" in sass and "F2FP.SATFINITE.E4M3" in sass  # the amaxes sent by st.async; h rounded to e4m3
    assert "MEMBAR.ALL.GPU" not in sass.split("UCGABAR_WAIT", 1)[1], "a fence in the tile loop"
    # ptxas spills a few of the tile walk's values (28 bytes with nvcc 13: reloaded once a tile), but none in a
    # K loop, one for each tile width.
    loops = _k_loops(sass)
    assert len(loops) == 28 and not any(re.search(r"\b(LDL|STL)\b", "\n".join(loop)) for loop in loops)
    instructions = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s", sass, re.M))
    assert instructions < 80_000, f"{instructions} SASS instructions: an epilogue unrolled per element?"
    with pytest.raises(ValueError, match="cluster=2"):
        sm90.compile_cubin("bf16", sm90.STAGES, 1, sm90.nvcc_path(), weight_format="fp8", moe="gate_up")


@needs_nvcc
def test_fp8_moe_down_cubin_takes_tiles_of_at_most_128_rows(tmp_path):
    """The FP8 MoE down (ET_TRT_FP8 with ET_TRT_MOE=2): e4m3 wgmma at tile widths 8-128 only (a second accumulator
    for each block of K's product), no spills; it waits for the grid before it, as every FP8 build."""
    pytest.importorskip("triton", reason="cuobjdump comes with Triton here")
    image = sm90.image("bf16", weight_format="fp8", moe="down")
    assert (image.kernel, image.variant, image.weight_format, image.block_k) == ("moe_down", "wgmma", "fp8", 128)
    assert image.waits_for_prior_grid
    assert image.shared_bytes == sm90.shared_bytes(sm90.FP8_DOWN_STAGES, 128)  # stages of 128 + 128 rows
    sass = _sass(image.image.bytes(), tmp_path)
    widths = {int(n) for n in re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3\s", sass)}
    assert widths == set(range(8, 129, 8)), sorted(widths)
    assert "HGMMA" not in sass and "UTMALDG.2D.MULTICAST" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "registers spill to local memory"


@needs_nvcc
def test_image_comes_from_the_disk_cache(monkeypatch):
    first = sm90.image("bf16")
    monkeypatch.setattr(sm90, "compile_cubin", lambda *a, **k: pytest.fail("compiled although the cache holds it"))
    assert sm90.image("bf16") == first


def test_missing_nvcc_is_named_and_triton_images_still_come(monkeypatch, caplog):
    monkeypatch.setattr(sm90, "nvcc_path", lambda: None)
    monkeypatch.setenv(parallel_compile.JOBS_ENV, "1")  # compile processes would not see the patch
    with pytest.raises(RuntimeError, match="nvcc not found"):
        sm90.image("bf16")
    pytest.importorskip("triton", reason="the Triton variants need Triton")
    images = aot.grouped_mm_images(["sm_90a"], "bf16", True)
    assert images and not any(i.variant == "wgmma" for i in images)
    assert "nvcc not found" in caplog.text


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="fp32"):
        sm90.compile_cubin("fp32", sm90.STAGES, sm90.CLUSTER, sm90.nvcc_path() or "nvcc")


def test_serialized_wgmma_pipeline_fails_the_build(tmp_path):
    """ptxas builds a kernel whose wgmma no longer overlaps (e.g. across a call it did not
    inline) with only an info line: the build must stop rather than ship a slow kernel."""
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "-o" ]; do shift; done\n'
        'printf "\\177ELF" > "$2"\n'
        'echo "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized" >&2\n')
    fake_nvcc.chmod(0o755)
    with pytest.raises(RuntimeError, match="serialized the wgmma pipeline"):
        sm90.compile_cubin("bf16", sm90.STAGES, sm90.CLUSTER, str(fake_nvcc))
