"""Ahead-of-time build of the INT4 experts' mma.sync kernels (moe_int4_mma.cu) with nvcc.

They take the per-pair kernels' launch and arguments (int4_kernels.py's moe_int4_gemv_gate_up_kernel and
moe_int4_gemv_down_kernel: grid (pairs, column blocks), the combine after the down). In an export their images are
"moe_mma_gate_up", "moe_mma_gate_up_gated" and "moe_mma_down", variant "mma_p<pairs per pass>" (H and F multiples
of 16; "mma_p<pairs>_by_expert" for the BY_EXPERT builds, whose grid the launcher makes min(pairs, experts)
programs across), which runtime/kernels/moe_experts_launcher.cc runs where its INT4 rule says (the sweep,
benchmarks/int4_gemv_sweep.py, forces them with MoEExpertsLauncher.set_int4_path("mma")). One MmaConfig is the
blocking of one kernel; a build takes one for the gate+up kernels and one for the down. Cubins for each
architecture, and PTX for sm_80 (the portable fallback) at aot's PTX version for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import subprocess
import tempfile

from et_trt_backend.kernels import aot, sm90
from et_trt_backend.kernels.images import cached_image
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.serialization.named_data import NamedData

logger = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("moe_int4_mma.cu")
_ELEM = {"bf16": "__nv_bfloat16", "fp16": "__half"}
# MODE of the .cu -> its entry, and the image's kernel name in an export and in the sweep
_ENTRIES = {0: "moe_int4_mma_gate_up", 1: "moe_int4_mma_gate_up", 2: "moe_int4_mma_down"}
KERNELS = {0: "moe_mma_gate_up", 1: "moe_mma_gate_up_gated", 2: "moe_mma_down"}


@dataclasses.dataclass(frozen=True)
class MmaConfig:
    """Warps per block, 16-row weight tiles per warp, pairs per pass (a multiple of 8), 32-element chunks of K per
    stage, stages, scale groups held in shared memory at once; by_expert: the .cu's BY_EXPERT."""

    warps: int
    tiles: int
    pairs: int
    chunks: int
    stages: int
    scale_groups: int = 32
    by_expert: bool = False

    @property
    def label(self) -> str:
        return f"w{self.warps}t{self.tiles}p{self.pairs}c{self.chunks}s{self.stages}" + ("e" if self.by_expert else "")

    def rows(self) -> int:
        return self.warps * self.tiles * 16

    def features(self, mode: int) -> int:
        """Output features per block: gated gate+up tiles hold 8 features' gate and up rows."""
        return self.rows() // 2 if mode == 1 else self.rows()

    def shared_bytes(self) -> int:
        """The .cu's layout: the stage ring (weight rows + 16, activation rows + 32 bytes of padding), the scales'
        window (rows x (groups + 2) bf16, 16-byte aligned), the pass's pairs."""
        stage = self.rows() * (self.chunks * 16 + 16) + self.pairs * (self.chunks * 64 + 32)
        scales = -(-self.rows() * (self.scale_groups + 2) * 2 // 16) * 16
        return self.stages * stage + scales + 4 * self.pairs


def sweep_label(gate_up: MmaConfig, down: MmaConfig) -> str:
    """The sweep's name for a build (benchmarks/device/prepare.py's MMA_SWEEP)."""
    return f"mma_{gate_up.label}_{down.label}"


def _defines(config: MmaConfig, mode: int, dtype: str, wait_prior_grid: bool) -> list[str]:
    return [f"-DMODE={mode}", f"-DWARPS={config.warps}", f"-DMT={config.tiles}", f"-DNP={config.pairs}",
            f"-DCHUNKS={config.chunks}", f"-DSTAGES={config.stages}", f"-DMAX_SCALE_GROUPS={config.scale_groups}",
            f"-DELEM={_ELEM[dtype]}", f"-DBY_EXPERT={int(config.by_expert)}", f"-DSHARED_BYTES={config.shared_bytes()}",
            f"-DWAIT_PRIOR_GRID={int(wait_prior_grid)}"]


def _run(command: list[str], what: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{os.path.basename(command[0])} failed on {what}:\n{result.stderr[-4000:]}")
    report = "\n".join(line.strip() for line in result.stderr.splitlines() if "registers" in line or "spill" in line)
    if any(" 0 bytes spill" not in line for line in report.splitlines() if "spill" in line):
        raise RuntimeError(f"{what} spills to local memory:\n{report}")
    return report


def compile_image(config: MmaConfig, mode: int, dtype: str, arch: str, fmt: str, nvcc: str,
                  source: pathlib.Path = SOURCE) -> bytes:
    """One MODE's build of `source` (the shipped .cu, or another form of it for a comparison): a cubin for `arch`,
    or (fmt "ptx") PTX for its virtual architecture at aot's PTX version, checked by ptxas; a RuntimeError naming the
    problem if a compiler fails or the kernel spills to local memory."""
    cap = aot._capability(arch)
    what = f"{source.name} ({config.label}, mode {mode}, {dtype}, {arch} {fmt})"
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / f"kernel.{fmt}"
        target = f"-arch={aot._arch_name(cap)}" if fmt == "cubin" else f"-arch=compute_{cap}"
        logger.info("compiling %s", what)
        _run([nvcc, f"-{fmt}", target, "-O3", "-std=c++17", "-Xptxas=-v",
              *_defines(config, mode, dtype, aot.waits_for_prior_grid(arch, fmt)),
              str(source), "-o", str(out)], what)
        if fmt == "cubin":
            return out.read_bytes()
        # nvcc writes its own PTX ISA version; the drivers that JIT this fallback take aot's (it uses nothing newer).
        version = aot._PTX_VERSION[cap]
        ptx = re.sub(r"^\.version \S+", f".version {version // 10}.{version % 10}", out.read_text(), count=1,
                     flags=re.M)
        out.write_text(ptx)
        _run([str(pathlib.Path(nvcc).with_name("ptxas")), "-v", f"-arch=sm_{cap}", str(out), "-o",
              str(out.with_suffix(".cubin"))], what)
        return ptx.encode()


def images(arch: str, dtype: str, gate_up: MmaConfig, down: MmaConfig, fmt: str = "cubin",
           source: pathlib.Path = SOURCE) -> list[KernelImage]:
    """The three images (gate+up, gated gate+up, down) of one build of `source` for `arch`, from the disk cache where
    there."""
    nvcc = sm90.nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found: the INT4 mma.sync kernels need the CUDA toolkit's nvcc on PATH")
    if (gate_up.pairs, gate_up.by_expert) != (down.pairs, down.by_expert):
        raise ValueError(f"a build's two kernels take one number of pairs per pass and one grid (by_expert); got "
                         f"{gate_up} and {down}")
    cap = aot._capability(arch)
    text = source.read_text()
    # An older form of the .cu (a comparison's) may not wait for the grid before it: its images must not say so.
    waits = aot.waits_for_prior_grid(arch, fmt) and "WAIT_PRIOR_GRID" in text
    built = []
    for mode, entry in _ENTRIES.items():
        config = down if mode == 2 else gate_up
        variant = f"mma_p{config.pairs}" + ("_by_expert" if config.by_expert else "")
        key = [text, sm90.nvcc_version(nvcc), cap, dtype, fmt, mode, dataclasses.astuple(config),
               aot._PTX_VERSION[cap], KERNELS[mode], variant]
        image = cached_image(key, lambda config=config, mode=mode, entry=entry, variant=variant: KernelImage(
            kernel=KERNELS[mode], variant=variant, trans_b=True, arch=aot._arch_name(cap), format=fmt,
            image=NamedData.of(compile_image(config, mode, dtype, arch, fmt, nvcc, source)), entry=entry, dtype=dtype,
            num_warps=config.warps, shared_bytes=config.shared_bytes(), global_scratch_bytes=0,
            global_scratch_align=1, profile_scratch_bytes=0, block_m=config.pairs, block_n=config.features(mode),
            block_k=32 * config.chunks, persistent=False,
            ptx_version="" if fmt == "cubin" else f"{aot._PTX_VERSION[cap] // 10}.{aot._PTX_VERSION[cap] % 10}",
            weight_format="int4", waits_for_prior_grid=waits))
        built.append(image)
    return built
