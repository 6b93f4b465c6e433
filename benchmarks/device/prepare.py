"""Compiles, on this (CPU) machine, the kernel images a device run needs, into .device/.

    python benchmarks/device/prepare.py        # then: run benchmarks/device/run_all.sh there, carry .device
    python benchmarks/device/prepare.py --moe  # only what benchmarks/device/moe_run.sh needs (the MoE block and
                                               # the grouped GEMM's tests)
    python benchmarks/device/prepare.py --int4 # only what benchmarks/device/int4_run.sh needs
    python benchmarks/device/prepare.py --moe-fp8  # only what benchmarks/device/moe_fp8_run.sh needs
    python benchmarks/device/prepare.py --sweep # only what benchmarks/device/moe_sweep_run.sh needs
    python benchmarks/device/prepare.py --moe --sweep  # both: benchmarks/device/moe_run.sh with MOE_SWEEP=1
    python benchmarks/device/prepare.py --gpu-tests  # only what benchmarks/device/gpu_tests_run.sh needs (the
                                                     # images of every GPU test module, no benchmark's)
    python benchmarks/device/prepare.py --gpu-tests --int4 --pack  # the selections combine; --pack compresses
                                                     # .device into .devpack/device.tgz: carry .devpack, and
                                                     # run_packed.sh runs several scripts in one call

.device/images.json        every variant for sm_90a, both dtypes and layouts, plus sm_80 PTX, and the
                           fp8 images of both dtypes (tests; --moe too)
.device/bench_images.json  bf16, trans_b: ours, the 48 KiB baseline and tuning candidates
.device/bench_images.groups.json  which of those each benchmark contender launches
.device/fp8_bench_images.json (+ .groups.json)  the same for benchmarks/fp8_grouped_mm_bench.py
.device/moe_images.json    the MoE experts kernels for sm_90a, both dtypes, plus sm_80 PTX (--moe; tests)
.device/moe_bench_images.json (+ .groups.json)  benchmarks/moe_block_bench.py's contenders (--moe)
.device/moe_fp8_images.json  the FP8 MoE experts kernels for sm_90a, both dtypes (--moe-fp8; tests)
.device/moe_fp8_bench_images.json (+ .groups.json)  benchmarks/moe_fp8_block_bench.py's fused contenders:
                           "fused_fp8" (bf16 FP8 images), "fused_fp8_no_small" (without the "small" tiling: is
                           it the faster where the launcher takes it?) and "fused_bf16" (the bf16 ones) (--moe-fp8)
.device/moe_fp8_sweep_images.json (+ .groups.json)  the same contenders with "fused_fp8_<name>" for each of
                           FP8_DOWN_CANDIDATES and FP8_DOWN_WGMMA_CANDIDATES: the FP8 images with another down
                           GEMM in the "large" tiling (the one the launcher takes at the MoE shapes), and
                           "fused_fp8_repeat" (the shipped images again: the measurement's spread) (--moe-fp8;
                           moe_fp8_sweep_run.sh)
.device/moe_sweep_images.json (+ .groups.json)  benchmarks/moe_sweep.py's contenders: the shipped Triton tilings,
                           the wgmma GEMMs built with other stages and cluster sizes, other Triton tilings (--sweep)
.device/int4_images.json   the INT4 expert kernels (MoE and GroupedMM) for sm_90a, both dtypes, plus their sm_80
                           PTX, and the bf16 MoE experts kernels (tests/test_int4_gpu.py,
                           benchmarks/int4_experts_bench.py; --int4)
.device/int4_sweep_images.json (+ .groups.json)  benchmarks/int4_gemv_sweep.py's blockings of the vector-matrix
                           and mma.sync INT4 kernels for sm_90a, bf16: each group the images of one
                           (--int4)
.device/executorch/fused_moe.py  ExecuTorch CUDA backend's Triton fused_moe, the benchmark's comparator, as its
                           authors wrote it (from the fetched pytorch/executorch, --executorch; --int4)
.device/flatbuffers        flatc and the flatbuffers headers of this machine: the launcher reads the images'
                           fields through the blob schema's generated header, which the device cannot make
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from et_trt_backend.kernels import aot, int4_mma, moe_aot, sm90  # noqa: E402
from et_trt_backend.kernels.images import load_images, save_images  # noqa: E402
from et_trt_backend.serialization.named_data import NamedData  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / ".device"
PACK = OUT.parent / ".devpack" / "device.tgz"
EXECUTORCH_GIT = pathlib.Path("/work/.mirror/pytorch+executorch/repo")  # where the fetch tool puts it
ARCH = "sm_90a"
# The kind of kernel Torch-TensorRT's Triton plugin runs: TensorRT's own AOT
# launcher does not opt in to more than 48 KiB of shared memory.
BASELINE_48K = aot.TileConfig("tile48k", 128, 128, 32, 3, 4, False, 16)
# Tuning candidates for sm_90a: "large_" ones are timed at the MoE shapes, "small_" ones at robot sizes,
# "all_" ones at both.
CANDIDATES = {
    # The defaults again: repeats that show the measurement's spread.
    "large_repeat_128x256x64_s4_w8": aot.TileConfig("tma", 128, 256, 64, 4, 8, True, 8),
    "small_repeat_64x128x128_s3_w4": aot.TileConfig("tma", 64, 128, 128, 3, 4, True, 8),
}


def copy_flatbuffers() -> None:
    """flatc and the headers of one release (Debian's flatbuffers-compiler and libflatbuffers-dev, which
    scripts/system_packages.sh installs), laid out as runtime/cmake/blob_schema.cmake finds them."""
    target = OUT / "flatbuffers"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree("/usr/include/flatbuffers", target / "include" / "flatbuffers")
    (target / "bin").mkdir()
    shutil.copy2("/usr/bin/flatc", target / "bin" / "flatc")


def save_fp8_bench_images() -> None:
    """.device/fp8_bench_images.json and its groups: benchmarks/fp8_grouped_mm_bench.py's contenders."""
    fp8 = aot.grouped_mm_images([ARCH], "bf16", True, weight_format="fp8")
    quantize = [i for i in fp8 if i.variant.startswith("quantize_rows")]
    contenders = {
        "ours_bf16": [i for i in aot.grouped_mm_images([ARCH], "bf16", True) if i.format == "cubin"],
        "ours_fp8": fp8,
        "ours_fp8_wgmma": [i for i in fp8 if i.variant == "wgmma"] + quantize,
        "ours_fp8_triton": [i for i in fp8 if i.variant != "wgmma"],
        # The shipped images again: a repeat in the same rounds shows the measurement's spread.
        "ours_fp8_try_repeat": fp8,
    }
    save_contenders("fp8_bench_images", contenders)


def save_contenders(name: str, contenders: dict) -> list:
    """.device/<name>.json: the contenders' images, each once (a call carries at most 64 MiB); <name>.groups.json:
    which of them each launches. Returns the images."""
    images, groups, index = [], {}, {}
    for label, chosen in contenders.items():
        for image in chosen:
            if id(image) not in index:
                index[id(image)] = len(images)
                images.append(image)
        groups[label] = [index[id(image)] for image in chosen]
    save_images(OUT / f"{name}.json", images)
    (OUT / f"{name}.groups.json").write_text(json.dumps(groups))
    return images


def save_test_images() -> None:
    """.device/images.json: tests/test_kernel_gpu.py's images."""
    tests = []
    for dtype in aot.DTYPES:
        for trans_b in (False, True):
            tests += aot.grouped_mm_images([ARCH], dtype, trans_b)
        tests += aot.grouped_mm_images([ARCH], dtype, True, weight_format="fp8")
    save_images(OUT / "images.json", tests)


def save_moe_test_images() -> list:
    """.device/moe_images.json: tests/test_moe_experts_gpu.py's images. Returns them."""
    tests = [i for dtype in aot.DTYPES for i in moe_aot.moe_experts_images([ARCH], dtype)]
    save_images(OUT / "moe_images.json", tests)
    return tests


def save_moe_images() -> None:
    """.device/moe_images.json (the MoE experts GPU tests' images) and benchmarks/moe_block_bench.py's contenders:
    "unfused", our GroupedMM images; "fused", the MoE experts images the launcher picks from (the wgmma GEMMs at
    many rows per expert); "fused_triton", the same without the wgmma GEMMs."""
    tests = save_moe_test_images()
    fused = [i for i in tests if i.dtype == "bf16" and i.format == "cubin"]
    save_contenders("moe_bench_images", {
        "unfused": [i for i in aot.grouped_mm_images([ARCH], "bf16", True) if i.format == "cubin"],
        "fused": fused,
        "fused_triton": [i for i in fused if i.variant != "wgmma" and i.kernel != "moe_gather"],
    })


# Sweep candidates for the FP8 down GEMM of the "large" tiling (moe_fp8_down.py; issue 32: on an H100 the Triton
# down ran at 363 TFLOP/s, the gate+up at 658), each 128 rows x 128 columns, 8 warps, in place of the shipped "large"
# down (since the 2026-12-07 H100 sweep the Gluon "wgmma_t4_s5" below, moe_aot.FP8_LARGE_DOWN_WGMMA; before, Triton,
# K steps of 128, 4 stages, 188 registers): name -> (stages, split_k) for the Triton candidate kernel,
# (stages, step) for the Gluon one. "pf_s4": the block scales loaded a block ahead (192 registers; the shipped loop
# already issues that load before its wgmma: a control, expected within the noise); "split_s4": that and the second
# half of each block's K left in flight while the previous block is promoted (235 registers; ptxas serializes its
# wgmmas, C7514); "wgmma_t<step>_s<stages>": Gluon, step - 1 of every step promotions overlapping a wgmma (237, 255,
# 244 registers). None spills. The "large" tilings swept before (3 stages, K steps of 64, a 64-column down, 64-row
# tiles) are in benchmarks/results/h100_moe_fp8acc/: 4 stages won and ships.
FP8_DOWN_CANDIDATES = {"pf_s4": (4, False), "split_s4": (4, True)}
FP8_DOWN_WGMMA_CANDIDATES = {"wgmma_t2_s4": (4, 2), "wgmma_t4_s4": (4, 4), "wgmma_t4_s5": (5, 4)}


def fp8_wgmma_gate_up_candidate(dtype: str) -> list:
    """The wgmma kernel's FP8 gate+up (sm90.py; not shipped until a GPU has run it) and the gather that copies the
    quantized rows before it: with them the launcher runs it in place of the Triton gate+up."""
    return [sm90.image(dtype, weight_format="fp8", moe="gate_up"), *moe_aot.gather_images(ARCH, dtype)]


def save_moe_fp8_test_images() -> dict:
    """.device/moe_fp8_images.json: tests/test_moe_experts_fp8_gpu.py's images, and moe_fp8_candidate_images.json
    those plus fp8_wgmma_gate_up_candidate (its candidate tests). Returns the shipped ones by dtype."""
    fp8 = {dtype: moe_aot.moe_experts_images([ARCH], dtype, "fp8") for dtype in aot.DTYPES}
    save_images(OUT / "moe_fp8_images.json", [i for images in fp8.values() for i in images])
    save_images(OUT / "moe_fp8_candidate_images.json",
                [i for dtype, images in fp8.items() for i in images + fp8_wgmma_gate_up_candidate(dtype)])
    return fp8


# Git revisions, comma-separated, each "<revision>" or "<revision>:<stages>": the wgmma kernel's FP8 MoE down also
# built from grouped_mm_sm90.cu as it was there (with that many stages; the shipped count by default), timed in the
# FP8 block bench as "fused_fp8_down_<revision>[_s<stages>]" (the shipped FP8 images with that down instead;
# environment variable FP8_DOWN_REV, none by default): changes of that kernel against its earlier forms in the same
# rounds. BF16_DOWN_REV the same for the bf16 block's wgmma down ("fused_bf16_down_<revision>[_s<stages>]").
FP8_DOWN_REV = os.environ.get("FP8_DOWN_REV", "")
BF16_DOWN_REV = os.environ.get("BF16_DOWN_REV", "")


@contextlib.contextmanager
def kernel_source_at(revision: str, name: str):
    """A temporary copy of et_trt_backend/kernels/<name> as it was at git revision `revision`."""
    text = subprocess.run(["git", "show", f"{revision}:et_trt_backend/kernels/{name}"], capture_output=True, text=True,
                          check=True, cwd=OUT.parent).stdout
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / name
        source.write_text(text)
        yield source


def down_image_at(revision: str, stages: int, weight_format: str):
    """The shipped wgmma MoE down image (sm_90a, bf16, weight_format "fp8" or "dense") with its cubin built from the
    .cu at `revision`, `stages` stages. It may ask for all of Hopper's shared memory: the kernel checks that what it
    uses fits."""
    with kernel_source_at(revision, sm90.SOURCE.name) as source:
        cubin = sm90.compile_cubin("bf16", stages, sm90.CLUSTER, sm90.nvcc_path(), weight_format, "down",
                                   source=source)
        y_in_dtype = "y_in_dtype" in source.read_text()  # its rows in bf16 (else float32, as before that change)
    return dataclasses.replace(sm90.image("bf16", weight_format=weight_format, moe="down"), image=NamedData.of(cubin),
                               shared_bytes=227 * 1024, y_in_dtype=y_in_dtype)


def down_revisions(revisions: str, weight_format: str) -> dict:
    """FP8_DOWN_REV's or BF16_DOWN_REV's contender names and their downs."""
    precision = "fp8" if weight_format == "fp8" else "bf16"
    shipped = sm90.FP8_DOWN_STAGES if weight_format == "fp8" else sm90.STAGES
    downs = {}
    for entry in filter(None, revisions.split(",")):
        revision, _, stages = entry.partition(":")
        name = f"fused_{precision}_down_{revision}" + (f"_s{stages}" if stages else "")
        downs[name] = down_image_at(revision, int(stages) if stages else shipped, weight_format)
    return downs


def save_moe_fp8_images() -> None:
    """.device/moe_fp8_images.json, benchmarks/moe_fp8_block_bench.py's fused contenders and the sweep's (the
    docstring)."""
    fp8 = save_moe_fp8_test_images()
    contenders = {
        "fused_fp8": fp8["bf16"],
        "fused_fp8_no_small": [i for i in fp8["bf16"] if i.variant != "small"],
        # sm_90a: the wgmma kernel's FP8 gate+up (the candidate) before its down
        "fused_fp8_wgmma_gate_up": fp8["bf16"] + fp8_wgmma_gate_up_candidate("bf16"),
        # sm_90a: without the wgmma kernel's FP8 down (the Triton/Gluon down at every size, as before it)
        "fused_fp8_triton_down": [i for i in fp8["bf16"] if i.variant != "wgmma"],
        "fused_bf16": [i for i in moe_aot.moe_experts_images([ARCH], "bf16") if i.format == "cubin"],
    }
    for name, down in down_revisions(FP8_DOWN_REV, "fp8").items():
        contenders[name] = contenders["fused_fp8_triton_down"] + [down]
    bf16_others = [i for i in contenders["fused_bf16"] if (i.kernel, i.variant) != ("moe_down", "wgmma")]
    for name, down in down_revisions(BF16_DOWN_REV, "dense").items():
        contenders[name] = bf16_others + [down]
    save_contenders("moe_fp8_bench_images", contenders)
    sweep = {"fused_fp8": fp8["bf16"], "fused_bf16": contenders["fused_bf16"], "fused_fp8_repeat": fp8["bf16"]}
    large = next(config for config in moe_aot.FP8_GEMM_CONFIGS if config.variant == "large")
    others = [i for i in fp8["bf16"] if (i.kernel, i.variant) != ("moe_down", "large")]
    downs = {name: moe_aot.fp8_down_candidate_image(
        ARCH, "bf16", dataclasses.replace(large, block_k=64 if split_k else 128, num_stages=stages), split_k)
        for name, (stages, split_k) in FP8_DOWN_CANDIDATES.items()}
    downs |= {name: moe_aot.fp8_down_wgmma_image("bf16", dataclasses.replace(large, num_stages=stages), step)
              for name, (stages, step) in FP8_DOWN_WGMMA_CANDIDATES.items()}
    for name, down in downs.items():
        logging.info("fused_fp8_%s: moe_down %d B shared", name, down.shared_bytes)
        sweep[f"fused_fp8_{name}"] = others + [down]
    images = save_contenders("moe_fp8_sweep_images", sweep)
    logging.info("%d sweep images, %.1f MB", len(images), (OUT / "moe_fp8_sweep_images.json").stat().st_size / 1e6)


# benchmarks/moe_sweep.py's wgmma builds: label -> (stages, CTAs per cluster); the first is the shipped one.
# (3 stages lost 20% in the GroupedMM builds on an H200, benchmarks/results/NOTES.md; clusters of one CTA were
# within 1% of two, or slower, in the last sweep, benchmarks/results/h100_moe_sweep/; clusters of 4 read a quarter
# of a tile's rows from L2 per CTA, half of what clusters of 2 read.)
WGMMA_SWEEP = {"fused_wgmma_s4_c2": (4, 2)}
# Its Triton tilings, each timed alone (with "any"): the two that won most often in the last full sweep of twelve
# (benchmarks/results/h100_moe_sweep/: 128 x 128 tiles with 3 and 4 stages, 8 warps, the best Triton tiling at many
# rows per expert, where the dispatch rule's edge lies; sm_90a only, so up to its 227 KiB of shared memory).
TILING_SWEEP = tuple(
    moe_aot.MoEGemmConfig(f"m{m}_n{n}_s{stages}_w{warps}" + (f"_k{k}" if k != 64 else ""), m, n, down_n, k, stages,
                          warps, 16)
    for m, n, down_n, k, stages, warps in ((128, 128, 128, 64, 4, 8), (128, 128, 128, 64, 3, 8)))


def save_moe_sweep_images() -> None:
    """.device/moe_sweep_images.json and its groups: "fused_tilings", the shipped Triton tilings (the launcher's
    choice among them); "fused_wgmma_*", those plus the row gather and a wgmma build (WGMMA_SWEEP);
    "fused_tile_<variant>", one tiling of TILING_SWEEP plus "any" (H or F not a multiple of 16). All bf16 cubins for
    sm_90a."""
    shipped = [i for i in moe_aot.moe_experts_images([ARCH], "bf16") if i.format == "cubin"]
    tilings = [i for i in shipped if i.variant != "wgmma" and i.kernel != "moe_gather"]
    gather = [i for i in shipped if i.kernel == "moe_gather"]
    needed = [i for i in tilings if i.kernel in ("moe_route", "moe_combine") or i.variant == "any"]
    contenders = {"fused_tilings": tilings}
    for label, (stages, cluster) in WGMMA_SWEEP.items():
        wgmma = [sm90.image("bf16", stages, cluster, moe=mode) for mode in sm90.MOE_MODES]
        contenders[label] = tilings + gather + wgmma
    for config in TILING_SWEEP:
        tiling = moe_aot.gemm_images(ARCH, "bf16", "cubin", configs=[config])
        contenders[f"fused_tile_{config.variant}"] = needed + tiling
    images = save_contenders("moe_sweep_images", contenders)
    logging.info("%d images, %.1f MB", len(images), (OUT / "moe_sweep_images.json").stat().st_size / 1e6)


def save_int4_test_images() -> None:
    """.device/int4_images.json: tests/test_int4_gpu.py's images (benchmarks/int4_experts_bench.py's too)."""
    images = [i for dtype in aot.DTYPES for i in moe_aot.moe_experts_images([ARCH], dtype, "int4")
              + aot.grouped_mm_images([ARCH], dtype, True, "int4")]
    images += [i for i in moe_aot.moe_experts_images([ARCH], "bf16") if i.format == "cubin"]
    # Route and combine read no weights: the INT4 and dense sets hold the same images once each.
    unique = {(i.kernel, i.variant, i.arch, i.format, i.dtype, i.weight_format): i for i in images}
    save_images(OUT / "int4_images.json", list(unique.values()))


def save_int4_images(executorch: pathlib.Path) -> None:
    """.device/int4_images.json and .device/executorch/fused_moe.py (the module docstring)."""
    save_int4_test_images()
    if not executorch.exists():  # int4_run.sh's benchmark needs it; int4_sweep_run.sh does not
        logging.warning("no ExecuTorch git directory at %s: .device/executorch not written (int4_run.sh's benchmark "
                        "needs it: fetch pytorch/executorch first)", executorch)
        return
    source = "backends/cuda/triton/kernels/fused_moe.py"
    commit = subprocess.run(["git", "-C", executorch, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    text = subprocess.run(["git", "-C", executorch, "show", f"{commit}:{source}"], capture_output=True, text=True,
                          check=True).stdout
    (OUT / "executorch").mkdir(exist_ok=True)
    (OUT / "executorch" / "fused_moe.py").write_text(text)
    (OUT / "executorch" / "SOURCE").write_text(f"pytorch/executorch {commit} {source}\n")
    logging.info("ExecuTorch's fused_moe.py from pytorch/executorch %s", commit)


# The INT4 kernels' blockings benchmarks/int4_gemv_sweep.py times (moe_aot.MoEGemvConfig). The vector-matrix ones
# (rows, 32-element chunks per step, warps, stages, gate and up in one loop): the shipped one (sweeps 1-3, h100_int4/,
# settled the blocking), forced onto the gemv path at every token count, where the launcher's rule gives the mma.sync
# kernels instead (pairs x H x F above 2^23). (The per-expert kernels those sweeps also timed, int4_rows.py, lost to
# the mma.sync ones and left the tree: git history keeps them.)
GEMV_SWEEP: list[tuple] = [(4, 32, 2, 2, True)]
GEMV_SWEEP_3LAUNCH = False  # also time them without moe_gemv_down_combine (sweep 2 did: 1.01x-1.17x slower)
# The mma.sync kernels (int4_mma.py, moe_int4_mma.cu): (gate+up blocking, down blocking), each MmaConfig(warps,
# 16-row tiles per warp, pairs per pass, chunks per stage, stages, by_expert=...). The shipped builds (moe_aot's
# MOE_MMA_CONFIGS: both families, the first-pair grid and BY_EXPERT), each forced onto the mma.sync path, so that
# the launcher's own choice ("shipped") can be compared with every build it could have taken. (Sweeps 4 and 5 also
# timed BY_EXPERT with 8 chunks x 5 stages and the 64-pair build with a 64-row down: where the rule runs their
# shipped twins, faster only on 8x1024x1024, by up to 6%, and up to 27% slower elsewhere; sweep 7, BY_EXPERT with
# 32 and 64 weight rows a program: faster than the launcher in 1 cell of 30, slower in 25: results/h100_int4/;
# BY_EXPERT with two 16-row tiles a warp at 32 and 64 pairs, for 256 tokens on few experts: 1.17x-1.45x slower than
# the launcher at 256 tokens on 8x1024x1024, tied at best elsewhere: results/h100_gate_up_epilogue/int4_gemv_sweep.md.)
MMA_SWEEP = list(moe_aot.MOE_MMA_CONFIGS)
# Builds also timed as sm_80 PTX (label + "_sm80", JIT by the driver as on any GPU without a cubin; the issue's
# bandwidth goal is the sm_80 images'): the 8-pair builds of both families (4-32 tokens).
MMA_SWEEP_PTX = [build for build in MMA_SWEEP if build[0].pairs == 8]
# A git revision: MMA_SWEEP also built from moe_int4_mma.cu as it was there (label + "_base"), so that one call times
# a change of the kernel's source against its previous form (environment variable MMA_BASELINE_REV; none by default).
MMA_BASELINE_REV = os.environ.get("MMA_BASELINE_REV", "")
# A git revision: the shipped INT4 launcher's images (sm_90a bf16 cubins: gemv, mma.sync, tiles, route, combine) as
# built there, timed by the launcher's own rule beside "shipped" (label "shipped_<revision>"; environment variable
# INT4_BASELINE_REV; none by default): a change of any INT4 kernel, Triton or CUDA, against its previous form.
INT4_BASELINE_REV = os.environ.get("INT4_BASELINE_REV", "")
_BASELINE_SCRIPT = """
import sys
from et_trt_backend.kernels import moe_aot
from et_trt_backend.kernels.images import save_images
save_images(sys.argv[1], [i for i in moe_aot.moe_experts_images(["sm_90a"], "bf16", "int4") if i.format == "cubin"])
"""


def baseline_int4_images(revision: str) -> list:
    """The shipped INT4 images (sm_90a bf16 cubins) built from a temporary worktree of `revision`."""
    root = OUT.parent
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), revision], check=True, cwd=root,
                       capture_output=True)
        try:
            logging.info("building the INT4 images of %s", revision)
            subprocess.run([sys.executable, "-c", _BASELINE_SCRIPT, str(pathlib.Path(tmp) / "images.json")],
                           check=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
            return load_images(pathlib.Path(tmp) / "images.json")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, cwd=root)


def gemv_sweep_label(block_n: int, block_c: int, warps: int, stages: int, paired: bool) -> str:
    return f"n{block_n}_k{32 * block_c}_w{warps}_s{stages}" + ("_paired" if paired else "")


def save_int4_sweep_images() -> None:
    """.device/int4_sweep_images.json: per blocking of GEMV_SWEEP (variant "gemv") and MMA_SWEEP (named
    as in an export) its images, and MMA_SWEEP_PTX's sm_80 PTX; with GEMV_SWEEP_3LAUNCH the GEMV_SWEEP ones also
    without moe_gemv_down_combine (label + "_3launch")."""
    contenders = {}
    for block_n, block_c, warps, stages, paired in GEMV_SWEEP:
        config = moe_aot.MoEGemvConfig("gemv", block_n, block_c, warps, stages, 16, paired)
        label = gemv_sweep_label(block_n, block_c, warps, stages, paired)
        contenders[label] = moe_aot.gemv_images(ARCH, "bf16", "cubin", [config])
        if GEMV_SWEEP_3LAUNCH:  # without the down and combine in one launch: what that launch saves
            contenders[label + "_3launch"] = [i for i in contenders[label] if i.kernel != "moe_gemv_down_combine"]
    for gate_up, down in MMA_SWEEP:
        contenders[int4_mma.sweep_label(gate_up, down)] = int4_mma.images(ARCH, "bf16", gate_up, down)
    if MMA_BASELINE_REV:  # the same builds of moe_int4_mma.cu as it was at that revision, label + "_base"
        with kernel_source_at(MMA_BASELINE_REV, int4_mma.SOURCE.name) as base:
            for gate_up, down in MMA_SWEEP:
                label = int4_mma.sweep_label(gate_up, down) + "_base"
                contenders[label] = int4_mma.images(ARCH, "bf16", gate_up, down, source=base)
    if INT4_BASELINE_REV:
        contenders[f"shipped_{INT4_BASELINE_REV}"] = baseline_int4_images(INT4_BASELINE_REV)
    for gate_up, down in MMA_SWEEP_PTX:
        contenders[int4_mma.sweep_label(gate_up, down) + "_sm80"] = int4_mma.images("sm_80", "bf16", gate_up, down,
                                                                                   "ptx")
    save_contenders("int4_sweep_images", contenders)


def save_default_images() -> None:
    """run_all.sh's images: the grouped GEMM's tests and its benchmarks' contenders."""
    save_test_images()
    save_fp8_bench_images()
    contenders = {
        "ours": [i for i in aot.grouped_mm_images([ARCH], "bf16", True) if i.format == "cubin"],
        # The 48 KiB kernel, plus "any" for the shapes it cannot take.
        "baseline48k": [aot.compile_image(ARCH, "bf16", True, BASELINE_48K),
                        aot.compile_image(ARCH, "bf16", True, aot.configs_for(ARCH)[-1])],
        **{label: [aot.compile_image(ARCH, "bf16", True, config)] for label, config in CANDIDATES.items()},
        "all_wgmma_only": [sm90.image("bf16")],  # the sm_90a kernel alone, also where the launcher picks another
        "all_wgmma_cluster1": [sm90.image("bf16", cluster=1)],  # without the rows' multicast
    }
    bench = save_contenders("bench_images", contenders)
    for image in bench:
        logging.info("%-22s %-7s %6d B shared, %3d B scratch/CTA, %dx%dx%d", image.kernel, image.arch,
                     image.shared_bytes, image.global_scratch_bytes, image.block_m, image.block_n, image.block_k)


def pack() -> None:
    """.devpack/device.tgz: .device compressed (its images shrink about eightfold), so that one call can carry the
    images of several scripts within the 64 MiB limit; run_packed.sh unpacks it there and runs them."""
    PACK.parent.mkdir(exist_ok=True)
    subprocess.run(["tar", "-czf", str(PACK), "-C", str(OUT.parent), OUT.name], check=True)
    logging.info("%s: %.1f MB (carry .devpack)", PACK, PACK.stat().st_size / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moe", action="store_true", help="the MoE block's images (moe_run.sh)")
    parser.add_argument("--int4", action="store_true", help="the INT4 experts' images (int4_run.sh)")
    parser.add_argument("--moe-fp8", action="store_true", help="the FP8 MoE block's images (moe_fp8_run.sh)")
    parser.add_argument("--sweep", action="store_true", help="the MoE sweep's images (moe_sweep_run.sh)")
    parser.add_argument("--gpu-tests", action="store_true",
                        help="the images of every GPU test module (gpu_tests_run.sh)")
    parser.add_argument("--pack", action="store_true",
                        help="also write .devpack/device.tgz, .device compressed (carry .devpack instead)")
    parser.add_argument("--executorch", type=pathlib.Path, default=EXECUTORCH_GIT,
                        help="a git directory of pytorch/executorch (--int4)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    copy_flatbuffers()
    if args.gpu_tests:
        save_test_images()
        save_moe_test_images()
        save_moe_fp8_test_images()
        save_int4_test_images()
    if args.moe_fp8:
        save_moe_fp8_images()
    if args.sweep:
        save_moe_sweep_images()
    if args.int4:
        save_int4_images(args.executorch)
        save_int4_sweep_images()
    if args.moe:
        save_test_images()
        save_moe_images()
    if not (args.gpu_tests or args.moe_fp8 or args.sweep or args.int4 or args.moe):
        save_default_images()
    if args.pack:
        pack()


if __name__ == "__main__":
    main()
