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

from et_trt_backend.kernels import parallel_compile, sm90
from et_trt_backend.kernels.images import cached_image
from et_trt_backend.serialization.kernel_image import WEIGHT_FORMATS, KernelImage, kernel_name
from et_trt_backend.options import FP8_ARCHS, NO_FP8_ARCHS, without_fp8
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

# The FP8 form (weights [G, N, K] only): operands are 1 byte, so BLOCK_K doubles for the same bytes per stage.
# "tma" and "tile" need K and N multiples of 16 (16-byte rows of a and b); "any" takes every K and N.
# "any" keeps BLOCK_K 32: with 64, ptxas spills (27 to 84 registers, by architecture).
_FP8_HOPPER_CONFIGS = (
    TileConfig("tma", 128, 256, 128, 4, 8, True, 16),
    TileConfig("tma_small", 64, 128, 128, 4, 4, True, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
_FP8_BLACKWELL_CONFIGS = (
    TileConfig("tma", 128, 256, 128, 3, 8, True, 16),
    TileConfig("tma_small", 64, 128, 128, 3, 4, True, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
_FP8_SMALL_SMEM_CONFIGS = (  # sm_120: 99 KiB
    TileConfig("tma", 128, 128, 128, 3, 8, True, 16),
    TileConfig("tma_small", 64, 64, 64, 3, 4, True, 16),  # BLOCK_K 128 spills a register there
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
_FP8_ADA_CONFIGS = (  # sm_89: no TMA, 99 KiB
    TileConfig("tile", 128, 128, 64, 4, 8, False, 16),
    TileConfig("any", 64, 64, 32, 3, 4, False, 1),
)
# INT4 weights (expert_precision "int4", et_trt_backend/int4_weights.py; [G, N, K] packed only), for every
# architecture: "gemv" and "gemv_any" are the vector-matrix kernel (int4_kernels.py: BLOCK_M 1 row, BLOCK_N weight
# rows, BLOCK_K = 32 * BLOCK_C elements per step), which the launcher takes for few rows per group; "tile" and
# "any" the tensor-core build of grouped_mm_kernel (BLOCK_K 32: one packed chunk per step). The "_any" ones take
# any K and N ("gemv": K and N multiples of 16, the activations' rows 32-byte aligned for vector loads).
_INT4_CONFIGS = (
    TileConfig("gemv", 1, 8, 256, 3, 2, False, 16),
    TileConfig("gemv_any", 1, 8, 256, 3, 2, False, 1),
    TileConfig("tile", 64, 64, 32, 4, 4, False, 16),
    TileConfig("any", 32, 64, 32, 3, 4, False, 1),
)
INT4_GEMV_VARIANTS = ("gemv", "gemv_any")


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """How one variant of the row quantization (quantize_rows.py) is compiled: the same for every architecture."""

    k_aligned: bool  # for K % 16 == 0 only: 16-byte vector loads and stores
    block_m: int = 4
    block_k: int = 1024
    num_warps: int = 4
    whole_rows: bool = False  # one read per row, kept in registers: only for K <= block_k
    swiglu: bool = False  # the rows are the SwiGLU of a gate+up output [rows, 2K] (an FP8 GroupedMM's activation)


# The row quantization's variants. The launcher takes "quantize_rows_whole" (one read of each row) for launches of
# few elements, which are latency-bound; at the MoE shapes two reads of blocks of 4 rows are faster (H200).
# The "quantize_rows_swiglu" ones, blocked the same, serve FP8 GroupedMMs whose input is a gate+up output
# (activation 1, lowering/fp8_swiglu.py).
_QUANTIZE_BLOCKINGS = {
    "": QuantizeConfig(k_aligned=True),
    "_whole": QuantizeConfig(k_aligned=True, block_m=1, block_k=4096, whole_rows=True),
    "_any": QuantizeConfig(k_aligned=False),
}
QUANTIZE_VARIANTS = {
    **{"quantize_rows" + suffix: config for suffix, config in _QUANTIZE_BLOCKINGS.items()},
    **{"quantize_rows_swiglu" + suffix: dataclasses.replace(config, swiglu=True)
       for suffix, config in _QUANTIZE_BLOCKINGS.items()},
}
# From sm_90 the FP8 GEMM starts while the row quantization runs (programmatic dependent launch, griddepcontrol);
# the launcher asks for it on the same architectures (kOverlapQuantizeMinCapability, runtime/kernels).
PDL_MIN_CAPABILITY = 90


def waits_for_prior_grid(arch: str, fmt: str) -> bool:
    """Whether a build of the MoE kernels that can wait for the grid before them (WAIT_PRIOR_GRID: moe_int4_mma.cu,
    moe_experts.wait_prior_grid) does: cubins from PDL_MIN_CAPABILITY (sm_80 PTX cannot hold griddepcontrol)."""
    return fmt == "cubin" and _capability(arch) >= PDL_MIN_CAPABILITY


# PTX ISA version each target is emitted with: the lowest that has the target,
# so older drivers JIT it (a CUDA 13.0 driver accepts up to 9.0; Triton 3.9's
# default, 9.4, is refused; JetPack 6 drivers stop at 8.5). Triton's TMA code
# needs 8.6 (cp.async.bulk.tensor into .shared::cta).
_PTX_VERSION = {80: 80, 86: 80, 87: 80, 89: 80, 90: 86, 100: 86, 110: 90, 120: 87}
# FP8 on sm_89: its mma needs PTX ISA 8.4. FP8 images are cubins only, so no driver JITs that PTX.
_FP8_PTX_VERSION = {89: 84}
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


def configs_for(arch: str, weight_format: str = "dense") -> tuple[TileConfig, ...]:
    cap = _capability(arch)
    if weight_format == "int4":
        return _INT4_CONFIGS
    if weight_format == "fp8":
        _check_fp8_arch(arch)
        return {89: _FP8_ADA_CONFIGS, 90: _FP8_HOPPER_CONFIGS, 120: _FP8_SMALL_SMEM_CONFIGS}.get(
            cap, _FP8_BLACKWELL_CONFIGS)
    if cap == 90:
        return _HOPPER_CONFIGS
    if cap in (100, 110):
        return _BLACKWELL_CONFIGS
    if cap == 120:
        return _SMALL_SMEM_CONFIGS
    return _AMPERE_CONFIGS


def _check_fp8_arch(arch: str) -> None:
    if without_fp8([arch]):
        raise ValueError(
            f"kernel architecture {arch} has no FP8 tensor cores, so expert_precision = \"fp8\" cannot run there "
            f"({', '.join(NO_FP8_ARCHS)} have none; FP8 needs {', '.join(FP8_ARCHS)}). Drop it "
            "from kernel_archs, or leave expert_precision unset for this part"
        )


def _check_form(dtype: str, trans_b: bool, weight_format: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"unsupported kernel dtype {dtype!r}; use one of {DTYPES}")
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unsupported weight format {weight_format!r}; use one of {WEIGHT_FORMATS}")
    if weight_format in ("fp8", "int4") and not trans_b:
        raise ValueError(f"{weight_format.upper()} kernels take weights stored [G, N, K] only (trans_b = True); the "
                         "lowering transposes the weights when it quantizes them")


def _source_hash(*modules: str) -> str:
    """Of the Triton source of `modules` (a kernel's module and those whose jit helpers it calls)."""
    import importlib

    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(importlib.import_module(f"et_trt_backend.kernels.{module}")).encode())
    return digest.hexdigest()[:16]


# The Triton modules each kernel source module calls into: a kernel's image depends on all of them.
KERNEL_SOURCES = {"grouped_mm": ("grouped_mm", "int4_tiles"), "moe_experts": ("moe_experts", "int4_tiles"),
                  "int4_kernels": ("int4_kernels", "int4_tiles", "moe_experts"),
                  "moe_fp8": ("moe_fp8", "moe_experts", "int4_tiles", "quantize_rows"),
                  "moe_fp8_down": ("moe_fp8_down", "moe_fp8", "moe_experts", "int4_tiles", "quantize_rows")}


def _arch_name(cap: int) -> str:
    return f"sm_{cap}a" if cap >= 90 else f"sm_{cap}"  # Triton targets sm_90+ as "a" (arch-specific)


def compile_image(
    arch: str, dtype: str, trans_b: bool, config: TileConfig, fmt: str = "cubin", weight_format: str = "dense"
) -> KernelImage:
    """Compiles (or reads from the disk cache) one variant for one architecture."""
    import triton

    _check_form(dtype, trans_b, weight_format)
    if fmt not in ("cubin", "ptx"):
        raise ValueError(f"image format must be 'cubin' or 'ptx', not {fmt!r}")
    cap = _capability(arch)
    ptx_version = _PTX_VERSION[cap]
    if weight_format == "fp8":
        _check_fp8_arch(arch)
        ptx_version = _FP8_PTX_VERSION.get(cap, ptx_version)
    key = [_source_hash(*KERNEL_SOURCES["grouped_mm"]), triton.__version__, cap, dtype, trans_b, fmt,
           dataclasses.asdict(config), ptx_version, weight_format, "no line info"]
    image = cached_image(key, lambda: _compile(arch, cap, dtype, trans_b, config, fmt, ptx_version, weight_format))
    # The FP8 GEMMs from sm_90 wait for the row quantization before them (WAIT_PRIOR_GRID in _compile): the image says
    # so, and GroupedMMLauncher starts only such an image during the quantization.
    return dataclasses.replace(image, waits_for_prior_grid=weight_format == "fp8" and cap >= PDL_MIN_CAPABILITY)


def _triton_compile(kernel, signature: dict, constexprs: dict, attrs: dict, cap: int, num_warps: int,
                    num_stages: int, ptx_version: int):
    import triton

    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource(kernel, signature, constexprs, attrs)
    else:
        source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    target = triton.backends.compiler.GPUTarget("cuda", cap, 32)
    # No line info: it holds this checkout's path to the kernel's source, and an export must not depend
    # on where it ran (same model and options, same bytes). The SASS is the same without it.
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.disable_line_info = True
        return triton.compile(source, target=target, options={
            "num_warps": num_warps, "num_stages": num_stages, "ptx_version": ptx_version, "enable_fp_fusion": True})


def _image(compiled, *, kernel: str, variant: str, trans_b: bool, cap: int, fmt: str, dtype: str, block_m: int,
           block_n: int, block_k: int, persistent: bool, ptx_version: int, weight_format: str) -> KernelImage:
    meta = compiled.metadata
    return KernelImage(
        kernel=kernel,
        variant=variant,
        trans_b=trans_b,
        arch=_arch_name(cap),
        format=fmt,
        image=NamedData.of(compiled.asm["cubin"] if fmt == "cubin" else compiled.asm["ptx"].encode()),
        entry=meta.name,
        dtype=dtype,
        num_warps=meta.num_warps,
        shared_bytes=meta.shared,
        global_scratch_bytes=meta.global_scratch_size,
        global_scratch_align=meta.global_scratch_align,
        profile_scratch_bytes=meta.profile_scratch_size,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        persistent=persistent,
        ptx_version=f"{ptx_version // 10}.{ptx_version % 10}",
        weight_format=weight_format,
    )


def _compile(
    arch: str, cap: int, dtype: str, trans_b: bool, config: TileConfig, fmt: str, ptx_version: int,
    weight_format: str,
) -> KernelImage:
    from et_trt_backend.kernels import grouped_mm, int4_kernels

    fp8, int4 = weight_format == "fp8", weight_format == "int4"
    logger.info("compiling %s for %s (%s, %s%s): %dx%dx%d tiles, %d stages, %d warps",
                kernel_name(config.variant, trans_b, weight_format), arch, dtype, fmt,
                f", {weight_format}" if fp8 or int4 else "", config.block_m, config.block_n, config.block_k,
                config.num_stages, config.num_warps)
    operand = "*fp8e4nv" if fp8 else "*" + dtype
    signature = {"a_ptr": operand, "b_ptr": "*u8" if int4 else operand, "offs_ptr": "*i32", "out_ptr": "*" + dtype,
                 "rows": "i32", "K": "i32", "N": "i32", "G": "i32"}
    if config.variant in INT4_GEMV_VARIANTS:
        kernel = int4_kernels.grouped_mm_int4_gemv_kernel
        signature |= {"b_scale_ptr": "*bf16", "group_size": "i32", "BLOCK_N": "constexpr", "BLOCK_C": "constexpr",
                      "GROUP_CHUNK": "constexpr"}
        constexprs = {"BLOCK_N": config.block_n, "BLOCK_C": config.block_k // 32, "GROUP_CHUNK": 32}
    else:
        kernel = grouped_mm.grouped_mm_kernel
        signature |= {"a_scale_ptr": "*fp32" if fp8 else "constexpr",
                      "b_scale_ptr": "*fp32" if fp8 else "*bf16" if int4 else "constexpr",
                      "FP8": "constexpr", "WAIT_PRIOR_GRID": "constexpr", "TRANS_B": "constexpr",
                      "USE_TMA": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                      "GROUP_CHUNK": "constexpr", "group_size": "i32" if int4 else "constexpr", "INT4": "constexpr"}
        constexprs = {"FP8": fp8, "WAIT_PRIOR_GRID": fp8 and cap >= PDL_MIN_CAPABILITY, "TRANS_B": trans_b,
                      "USE_TMA": config.use_tma, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                      "BLOCK_K": config.block_k, "GROUP_CHUNK": 32, "INT4": int4}
        if not fp8:  # dense and INT4 images have no activation scales; dense ones no weight scales either
            constexprs["a_scale_ptr"] = None
        if not int4:
            constexprs["group_size"] = 0
        if not (fp8 or int4):
            constexprs["b_scale_ptr"] = None
    # Pointers are 16-byte aligned (the launcher checks); K and N multiples as the variant requires.
    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]]
             for name in ("a_ptr", "b_ptr", "offs_ptr", "out_ptr", "b_scale_ptr") if signature[name] != "constexpr"}
    if config.k_n_multiple > 1:
        attrs[(5,)] = attrs[(6,)] = [["tt.divisibility", config.k_n_multiple]]
    compiled = _triton_compile(kernel, signature, constexprs, attrs, cap, config.num_warps, config.num_stages,
                               ptx_version)
    return _image(compiled, kernel=kernel_name(config.variant, trans_b, weight_format), variant=config.variant,
                  trans_b=trans_b, cap=cap, fmt=fmt, dtype=dtype,
                  block_m=config.block_m, block_n=config.block_n, block_k=config.block_k,
                  persistent=config.variant not in INT4_GEMV_VARIANTS, ptx_version=ptx_version,
                  weight_format=weight_format)


def quantize_rows_images(arch: str, dtype: str) -> list[KernelImage]:
    """The row quantization before an FP8 GEMM (quantize_rows.py) for one FP8 architecture, each variant, from the
    disk cache where there."""
    import triton

    _check_form(dtype, True, "fp8")
    cap = _capability(arch)
    _check_fp8_arch(arch)
    ptx_version = _FP8_PTX_VERSION.get(cap, _PTX_VERSION[cap])
    images = []
    for variant, config in QUANTIZE_VARIANTS.items():
        key = [_source_hash("quantize_rows"), triton.__version__, cap, dtype, dataclasses.asdict(config),
               ptx_version, "no line info"]
        images.append(cached_image(
            key, lambda variant=variant, config=config: _compile_quantize(arch, cap, dtype, variant, ptx_version,
                                                                          config)))
    return images


def _compile_quantize(arch: str, cap: int, dtype: str, variant: str, ptx_version: int,
                      config: QuantizeConfig) -> KernelImage:
    from et_trt_backend.kernels import quantize_rows

    logger.info("compiling %s for %s (%s)", variant, arch, dtype)
    signature = {"a_ptr": "*" + dtype, "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "rows": "i32", "K": "i32",
                 "BLOCK_M": "constexpr", "BLOCK_K": "constexpr", "LAUNCH_DEPENDENTS": "constexpr",
                 "WHOLE_ROWS": "constexpr", "SWIGLU": "constexpr"}
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_K": config.block_k,
                  "LAUNCH_DEPENDENTS": cap >= PDL_MIN_CAPABILITY, "WHOLE_ROWS": config.whole_rows,
                  "SWIGLU": config.swiglu}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    if config.k_aligned:
        attrs[(4,)] = [["tt.divisibility", 16]]
    compiled = _triton_compile(quantize_rows.quantize_rows_kernel, signature, constexprs, attrs, cap,
                               config.num_warps, 1, ptx_version)
    return _image(compiled, kernel=variant, variant=variant, trans_b=True, cap=cap, fmt="cubin", dtype=dtype,
                  block_m=config.block_m, block_n=1, block_k=config.block_k, persistent=False,
                  ptx_version=ptx_version, weight_format="fp8")


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


def grouped_mm_images(
    archs: Sequence[str], dtype: str, trans_b: bool, weight_format: str = "dense"
) -> list[KernelImage]:
    """Cubins for each architecture (every variant, launcher's preference order) plus portable PTX.

    For sm_90a with weights [G, N, K] the hand-written wgmma kernel comes first (needs
    nvcc; sm90.py). Architectures the installed compiler cannot target are skipped
    with a warning. weight_format "fp8": the FP8 GEMMs and each architecture's row
    quantization; every architecture must have FP8 tensor cores, and there is no PTX
    fallback (its sm_80 has none). weight_format "int4": the INT4 variants (_INT4_CONFIGS), for
    every architecture, and their sm_80 builds as PTX.
    """
    _check_form(dtype, trans_b, weight_format)
    fp8 = weight_format == "fp8"
    caps = [_capability(a) for a in archs]  # validates every name first
    if fp8:
        for arch in archs:
            _check_fp8_arch(arch)
    supported = _compiler_targets()
    sets = []
    for arch, cap in zip(archs, caps):
        if cap not in supported:
            logger.warning("skipping kernel architecture %s: the installed Triton/ptxas cannot target it", arch)
            continue
        logger.info("grouped_mm kernels for %s (%s, trans_b=%s, %s weights)", arch, dtype, trans_b, weight_format)
        if cap == 90 and trans_b and weight_format != "int4":
            sets += _sm90_wgmma_set(dtype, weight_format)
        sets.append(("grouped_mm", (arch, dtype, trans_b, weight_format, "cubin")))
    if not fp8:
        sets.append(("grouped_mm", (PTX_FALLBACK_ARCH, dtype, trans_b, weight_format, "ptx")))
    return parallel_compile.images(sets)


def arch_images(arch: str, dtype: str, trans_b: bool, weight_format: str, fmt: str) -> list[KernelImage]:
    """grouped_mm_images' Triton images of one architecture: cubins (FP8's row quantization last), or the PTX
    fallback's."""
    images = [compile_image(arch, dtype, trans_b, config, fmt=fmt, weight_format=weight_format)
              for config in configs_for(arch, weight_format)]
    if fmt == "cubin" and weight_format == "fp8":
        images += quantize_rows_images(arch, dtype)
    return images


def _sm90_wgmma_set(dtype: str, weight_format: str) -> list[parallel_compile.Set]:
    """The hand-written sm_90a kernel (grouped_mm_sm90.cu), which the launcher prefers; none without nvcc.
    weight_format "fp8": its e4m3 build (`dtype` is the activations' and output's)."""
    if sm90.nvcc_path() is None:
        logger.warning("nvcc not found: the sm_90a images lack the wgmma kernel (Triton's variants still serve; "
                       "install the CUDA toolkit for the faster MoE path)")
        return []
    return [("sm90", (dtype, weight_format, None))]
