"""Ahead-of-time compilation of the grouped GEMM to cubin and PTX, cached on disk (images.py).

Runs on any machine with Triton installed, GPU or not. Each image carries what
the C++ launcher (runtime/kernels/grouped_mm_launcher.h) needs to run it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import re
from collections.abc import Sequence

from et_trt_backend.kernels import sm90
from et_trt_backend.kernels.images import KernelImage, cached_image, kernel_name
from et_trt_backend.serialization.named_data import NamedData

logger = logging.getLogger(__name__)

DTYPES = ("bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """How one variant is compiled for one architecture family."""

    variant: str  # "tma" | "tma_small" | "tile" | "any" | a benchmark baseline name
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    use_tma: bool
    # K and N must be multiples of this (the launcher checks); 1 = any.
    k_n_multiple: int


# Per architecture family: the variants in the order the launcher prefers them.
# Shared memory budgets: sm_90/sm_100 227 KiB, sm_80/sm_87 163 KiB, sm_86/sm_89/sm_120 99 KiB per CTA.
# "tma_small" serves launches with few rows per group or too few large tiles to fill
# the GPU (the launcher chooses; measured on the H200, benchmarks/results/NOTES.md).
_HOPPER_CONFIGS = (
    TileConfig("tma", 128, 256, 64, 4, 8, True, 8),
    TileConfig("tma_small", 64, 128, 128, 3, 4, True, 8),
    TileConfig("tile", 128, 128, 64, 4, 8, False, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
_BLACKWELL_CONFIGS = (
    TileConfig("tma", 128, 256, 64, 3, 8, True, 8),
    TileConfig("tma_small", 64, 128, 128, 3, 4, True, 8),
    TileConfig("tile", 128, 128, 64, 3, 8, False, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
_SMALL_SMEM_CONFIGS = (  # sm_120 (consumer Blackwell): 99 KiB
    TileConfig("tma", 128, 128, 64, 3, 8, True, 8),
    TileConfig("tma_small", 64, 64, 64, 3, 4, True, 8),
    TileConfig("tile", 128, 128, 32, 4, 8, False, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
# "any" (odd K or N) loads 2-byte elements without cp.async: small tiles keep it out of local memory.
_AMPERE_CONFIGS = (  # cp.async + mma.sync; sized for sm_86/sm_89's 99 KiB
    TileConfig("tile", 128, 128, 32, 4, 8, False, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)

# PTX ISA version each target is emitted with: the lowest that has the target,
# so older drivers JIT it (a CUDA 13.0 driver accepts up to 9.0; Triton 3.9's
# default, 9.4, is refused; JetPack 6 drivers stop at 8.5). Triton's TMA code
# needs 8.6 (cp.async.bulk.tensor into .shared::cta).
_PTX_VERSION = {80: 80, 86: 80, 87: 80, 89: 80, 90: 86, 100: 86, 110: 90, 120: 87}
# Portable PTX: the sm_80 kernels as PTX, JIT-compiled by the driver on any newer GPU.
PTX_FALLBACK_ARCH = "sm_80"


def _capability(arch: str) -> int:
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    if not match or int(match.group(1)) not in _PTX_VERSION:
        raise ValueError(
            f"unsupported kernel architecture {arch!r}; use one of "
            f"{', '.join('sm_%d' % c for c in sorted(_PTX_VERSION))} (an 'a' suffix is accepted)"
        )
    return int(match.group(1))


def configs_for(arch: str) -> tuple[TileConfig, ...]:
    cap = _capability(arch)
    if cap == 90:
        return _HOPPER_CONFIGS
    if cap in (100, 110):
        return _BLACKWELL_CONFIGS
    if cap == 120:
        return _SMALL_SMEM_CONFIGS
    return _AMPERE_CONFIGS


def _source_hash() -> str:
    from et_trt_backend.kernels import grouped_mm  # imports Triton

    return hashlib.sha256(inspect.getsource(grouped_mm).encode()).hexdigest()[:16]


def compile_image(
    arch: str, dtype: str, trans_b: bool, config: TileConfig, fmt: str = "cubin"
) -> KernelImage:
    """Compiles (or reads from the disk cache) one variant for one architecture."""
    import triton

    if dtype not in DTYPES:
        raise ValueError(f"unsupported kernel dtype {dtype!r}; use one of {DTYPES}")
    if fmt not in ("cubin", "ptx"):
        raise ValueError(f"image format must be 'cubin' or 'ptx', not {fmt!r}")
    cap = _capability(arch)
    ptx_version = _PTX_VERSION[cap]
    key = [_source_hash(), triton.__version__, cap, dtype, trans_b, fmt, dataclasses.asdict(config), ptx_version,
           "no line info"]
    return cached_image(key, lambda: _compile(arch, cap, dtype, trans_b, config, fmt, ptx_version))


def _compile(
    arch: str, cap: int, dtype: str, trans_b: bool, config: TileConfig, fmt: str, ptx_version: int
) -> KernelImage:
    import triton

    from et_trt_backend.kernels import grouped_mm

    name = kernel_name(config.variant, trans_b)
    logger.info("compiling %s for %s (%s, %s): %dx%dx%d tiles, %d stages, %d warps", name, arch, dtype, fmt,
                config.block_m, config.block_n, config.block_k, config.num_stages, config.num_warps)
    elem = "*" + dtype
    signature = {"a_ptr": elem, "b_ptr": elem, "offs_ptr": "*i32", "out_ptr": elem,
                 "rows": "i32", "K": "i32", "N": "i32", "G": "i32",
                 "TRANS_B": "constexpr", "USE_TMA": "constexpr", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP_CHUNK": "constexpr"}
    constexprs = {"TRANS_B": trans_b, "USE_TMA": config.use_tma, "BLOCK_M": config.block_m,
                  "BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "GROUP_CHUNK": 32}
    # Pointers are 16-byte aligned (the launcher checks); K and N multiples as the variant requires.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    if config.k_n_multiple > 1:
        attrs[(5,)] = attrs[(6,)] = [["tt.divisibility", config.k_n_multiple]]
    source = triton.compiler.ASTSource(grouped_mm.grouped_mm_kernel, signature, constexprs, attrs)
    target = triton.backends.compiler.GPUTarget("cuda", cap, 32)
    # No line info: it holds this checkout's path to grouped_mm.py, and an export must not depend
    # on where it ran (same model and options, same bytes). The SASS is the same without it.
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.disable_line_info = True
        compiled = triton.compile(source, target=target, options={
            "num_warps": config.num_warps, "num_stages": config.num_stages, "ptx_version": ptx_version,
            "enable_fp_fusion": True})
    meta = compiled.metadata
    image = KernelImage(
        kernel=name,
        variant=config.variant,
        trans_b=trans_b,
        arch=f"sm_{cap}a" if cap >= 90 else f"sm_{cap}",  # Triton targets sm_90+ as "a" (arch-specific)
        format=fmt,
        image=NamedData.of(compiled.asm["cubin"] if fmt == "cubin" else compiled.asm["ptx"].encode()),
        entry=meta.name,
        dtype=dtype,
        num_warps=meta.num_warps,
        shared_bytes=meta.shared,
        global_scratch_bytes=meta.global_scratch_size,
        global_scratch_align=meta.global_scratch_align,
        profile_scratch_bytes=meta.profile_scratch_size,
        block_m=config.block_m,
        block_n=config.block_n,
        block_k=config.block_k,
        persistent=True,
        ptx_version=f"{ptx_version // 10}.{ptx_version % 10}",
    )
    return image


def _compiler_targets() -> set[int]:
    """Compute capabilities the installed Triton (and its ptxas) can compile for."""
    import triton

    supported = set()
    for cap in _PTX_VERSION:
        try:
            triton.backends.nvidia.compiler.get_ptxas(cap).version  # noqa: B018 (raises if absent)
            supported.add(cap)
        except Exception:  # pragma: no cover - depends on the installed toolchain
            pass
    return supported


def grouped_mm_images(archs: Sequence[str], dtype: str, trans_b: bool, weight_format: str = "dense") -> list[KernelImage]:
    """Cubins for each architecture (every variant, launcher's preference order) plus portable PTX.

    For sm_90a with weights [G, N, K] the hand-written wgmma kernel comes first (needs
    nvcc; sm90.py). Architectures the installed compiler cannot target are skipped
    with a warning. weight_format "dense" only: the FP8 images ("fp8") come with the
    FP8 kernels.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unsupported kernel dtype {dtype!r}; use one of {DTYPES}")
    if weight_format != "dense":
        raise ValueError(f"no {weight_format!r} grouped-GEMM kernel images in this build (weight format 'dense' "
                         "only): leave expert_precision unset")
    caps = [_capability(a) for a in archs]  # validates every name first
    supported = _compiler_targets()
    images = []
    for arch, cap in zip(archs, caps):
        if cap not in supported:
            logger.warning("skipping kernel architecture %s: the installed Triton/ptxas cannot target it", arch)
            continue
        logger.info("grouped_mm kernels for %s (%s, trans_b=%s)", arch, dtype, trans_b)
        if cap == 90 and trans_b:
            images += _sm90_wgmma_image(dtype)
        images += [compile_image(arch, dtype, trans_b, config) for config in configs_for(arch)]
    for config in configs_for(PTX_FALLBACK_ARCH):
        images.append(compile_image(PTX_FALLBACK_ARCH, dtype, trans_b, config, fmt="ptx"))
    return images


def _sm90_wgmma_image(dtype: str) -> list[KernelImage]:
    """The hand-written sm_90a kernel (grouped_mm_sm90.cu), which the launcher prefers; [] without nvcc."""
    if sm90.nvcc_path() is None:
        logger.warning("nvcc not found: the sm_90a images lack the wgmma kernel (Triton's variants still serve; "
                       "install the CUDA toolkit for the faster MoE path)")
        return []
    return [sm90.image(dtype)]
