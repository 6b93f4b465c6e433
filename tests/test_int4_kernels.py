"""The INT4 expert kernels on the CPU machine: their semantics in Triton's interpreter against int4_weights'
references (tests/int4_interpreter_check.py), and their AOT images (Orin's sm_87 cubins and the sm_80 PTX every
other GPU can run) checked with cuobjdump. The GPU side is tests/test_int4_gpu.py."""

import collections
import os
import pathlib
import re
import subprocess
import sys

import pytest

from et_trt_backend.kernels import aot, int4_mma, moe_aot

triton = pytest.importorskip("triton", reason="the INT4 kernels are Triton source")

REPO = pathlib.Path(__file__).resolve().parents[1]
CUOBJDUMP = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def test_kernels_in_triton_interpreter():
    """GroupedMM (tensor-core tiles and vector-matrix) at odd K and N, every group size, empty groups and invalid
    offsets; the MoE op's paths for every gate+up layout (each gate+up kernel; the shipped blocking on one layout:
    layouts differ in the gate+up only), a clamped and a non-gated activation, biases, invalid ids, odd sizes,
    skewed routing: against the references, every buffer poisoned."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "int4_interpreter_check.py")], capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0 and "interpreter ok" in result.stdout, (result.stdout + result.stderr)[-3000:]


def _sass_ops(image, tmp_path) -> tuple[str, collections.Counter]:
    path = tmp_path / f"{image.kernel}_{image.variant}_{image.arch}.cubin"
    path.write_bytes(image.image.bytes())
    elf = subprocess.run([CUOBJDUMP, "-elf", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([CUOBJDUMP, "-sass", path], capture_output=True, text=True, check=True).stdout
    arch = re.search(r"\bsm=(\d+)", elf)  # the ELF header's target
    ops = collections.Counter(m.split(".")[0] for m in re.findall(
        r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]+)", sass, re.M))
    assert arch, f"cuobjdump -elf names no architecture for {path.name}"
    return f"sm_{arch[1]}", ops


def _check_cubins(images, tmp_path) -> None:
    cubins = [i for i in images if i.format == "cubin"]
    assert cubins
    for image in cubins:
        arch, ops = _sass_ops(image, tmp_path)
        what = f"{image.kernel} ({image.variant})"
        assert arch == "sm_87" and image.arch == "sm_87", (what, arch)
        assert ops["LDL"] == ops["STL"] == 0, f"{what}: registers spill to local memory"
        # griddepcontrol (programmatic dependent launch) is sm_90's: Orin's images neither wait nor say they do.
        assert not image.waits_for_prior_grid and ops["ACQBULK"] == 0, what
        if image.weight_format != "int4":
            continue
        if "gemv" in image.variant:  # CUDA-core dot products, vector loads of the packed rows (per pair)
            assert ops["HMMA"] == 0 and ops["FFMA"] > 0, (what, ops["HMMA"], ops["FFMA"])
            assert ops["LDG"] > 0, what
        else:  # mma.sync on the unpacked values: Ampere's tensor cores
            assert ops["HMMA"] > 0, f"{what}: no mma.sync in the sm_87 SASS"


@pytest.mark.parametrize("dtype", ["fp16"])  # bf16 builds are test_moe_experts_images_for_orin's
def test_grouped_mm_images_for_orin(dtype, tmp_path):
    images = aot.grouped_mm_images(["sm_87"], dtype, True, "int4")
    assert {(i.variant, i.format) for i in images} == {(c.variant, f) for c in aot.configs_for("sm_87", "int4")
                                                      for f in ("cubin", "ptx")}
    assert all(i.weight_format == "int4" and i.kernel.endswith("_int4_nk") and i.dtype == dtype for i in images)
    assert {i.arch for i in images if i.format == "ptx"} == {"sm_80"}
    assert [i.persistent for i in images if i.format == "cubin"] == [False, False, True, True]
    _check_cubins(images, tmp_path)


def test_moe_experts_images_for_orin(tmp_path):
    images = moe_aot.moe_experts_images(["sm_87"], "bf16", "int4")
    cubins = [i for i in images if i.format == "cubin"]
    configs, gemvs = len(moe_aot.INT4_GEMM_CONFIGS), len(moe_aot.MOE_GEMV_CONFIGS)
    assert collections.Counter(i.kernel for i in cubins) == {
        "moe_route": len(moe_aot.MOE_ROUTE_CONFIGS), "moe_combine": 1, "moe_gate_up": configs,
        "moe_gate_up_gated": configs, "moe_down": configs, "moe_gemv_gate_up": gemvs,
        "moe_gemv_gate_up_gated": gemvs, "moe_gemv_down": gemvs, "moe_gemv_down_combine": gemvs,
        **{kernel: len(moe_aot.MOE_MMA_CONFIGS) for kernel in ("moe_mma_gate_up", "moe_mma_gate_up_gated",
                                                               "moe_mma_down")}}
    assert {i.weight_format for i in cubins if i.kernel.startswith(("moe_gate", "moe_down", "moe_gemv", "moe_mma"))} \
        == {"int4"}
    assert all(i.block_k == 32 for i in cubins if i.kernel in ("moe_gate_up", "moe_gate_up_gated", "moe_down"))
    # The launcher groups a build's three images by variant: one variant per build, both grids among them.
    mma_variants = {i.variant for i in cubins if i.kernel == "moe_mma_down"}
    assert len(mma_variants) == len(moe_aot.MOE_MMA_CONFIGS), mma_variants
    assert any(v.endswith("_by_expert") for v in mma_variants) and not all(v.endswith("_by_expert")
                                                                            for v in mma_variants), mma_variants
    assert {i.arch for i in images if i.format == "ptx"} == {"sm_80"} and len(images) == 2 * len(cubins)
    _check_cubins(images, tmp_path)


@pytest.mark.parametrize("weight_format", ["dense", "int4"])
def test_moe_images_from_sm90_wait_for_the_grid_before_them(weight_format, tmp_path):
    """Programmatic dependent launch: from sm_90 the launcher starts every MoE kernel of ours while the one before it
    runs (the wgmma GEMMs apart: GroupedMMLauncher's), so each must wait (griddepcontrol.wait: ACQBULK), let the next
    start (griddepcontrol.launch_dependents: PREEXIT), and its image say so; the sm_80 PTX does none of it."""
    images = moe_aot.moe_experts_images(["sm_90a"], "bf16", weight_format)
    for image in images:
        what = f"{image.kernel} ({image.variant}, {image.arch} {image.format})"
        if image.format == "ptx":
            assert not image.waits_for_prior_grid, what
            assert "griddepcontrol" not in image.image.bytes().decode(), what
            continue
        _, ops = _sass_ops(image, tmp_path)
        waits = image.variant != "wgmma"
        assert image.waits_for_prior_grid == waits and (ops["ACQBULK"] > 0) == waits, what
        assert (ops["PREEXIT"] > 0) == waits, what
    assert any(i.variant == "wgmma" for i in images) == (weight_format == "dense")


def test_int4_forms_are_refused_where_they_cannot_run():
    with pytest.raises(ValueError, match=r"INT4 kernels take weights stored \[G, N, K\] only"):
        aot.grouped_mm_images(["sm_87"], "bf16", False, "int4")
    with pytest.raises(ValueError, match="weight_format 'dense', 'int4' or 'fp8', not 'int3'"):
        moe_aot.moe_experts_images(["sm_87"], "bf16", "int3")
    with pytest.raises(ValueError, match="sm_87 has no FP8 tensor cores"):  # FP8 where INT4 runs: refused
        moe_aot.moe_experts_images(["sm_87"], "bf16", "fp8")


def test_mma_ptx_is_pinned_to_a_version_current_drivers_accept():
    for image in int4_mma.images("sm_80", "fp16", *moe_aot.MOE_MMA_CONFIGS[0], fmt="ptx"):
        version = re.search(r"^\.version (\d+)\.(\d+)$", image.image.bytes().decode(), re.M)
        assert version and f"{version[1]}.{version[2]}" == image.ptx_version == "8.0", image.kernel
        assert image.kernel.startswith("moe_mma_") and image.variant == "mma_p8" and image.format == "ptx"


def test_mma_build_takes_one_grid():
    """A build's two kernels share the launcher's grid: the first-pair grid or BY_EXPERT, not one of each."""
    with pytest.raises(ValueError, match="one grid"):
        int4_mma.images("sm_87", "bf16", int4_mma.MmaConfig(4, 1, 8, 4, 4, by_expert=True),
                        int4_mma.MmaConfig(4, 1, 8, 4, 4))
