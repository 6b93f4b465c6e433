"""Ahead-of-time compilation of the fused MoE experts kernels (moe_experts.py) to cubin and PTX, cached on disk.

The same machinery as the grouped GEMM's (aot.py): Triton compiles each kernel for each architecture with no GPU,
the images carry what runtime/kernels/moe_experts_launcher.cc needs. Image names: kernel "moe_route" (variant
"e<E_PAD>": experts it holds), "moe_gate_up" and "moe_gate_up_gated" (non-gated and gated activations),
"moe_down", "moe_combine"; the GEMMs' variants are their tilings (MOE_GEMM_CONFIGS), which the launcher picks by
the rows per expert; a gate+up and a down image of one variant share BLOCK_M (the route kernel's tile table).
sm_90a adds the wgmma kernel's MoE builds (sm90.py: "moe_gate_up_gated" and "moe_down" of variant "wgmma", with
nvcc) and "moe_gather", which copies their rows.

weight_format "int4" (expert_precision "int4", et_trt_backend/int4_weights.py): the route and combine images (the
dense ones: they read no weights), the two GEMMs' INT4 builds of the same tilings with BLOCK_K 32 (weight_format
"int4"), and the vector-matrix kernels the launcher takes for few pairs per expert (int4_kernels.py): kernels
"moe_gemv_gate_up", "moe_gemv_gate_up_gated" and "moe_gemv_down", variants "gemv" (H and F multiples of 16) and
"gemv_any", with "moe_gemv_down_combine" (down and combine in one launch); the mma.sync kernels (int4_mma.py, nvcc:
"moe_mma_gate_up", "moe_mma_gate_up_gated", "moe_mma_down", variants "mma_p<pairs per pass>") for up to tens of
pairs per expert; no wgmma
builds.

weight_format "fp8" (expert_precision "fp8" where the architecture has FP8 MMA; moe_fp8.py): "moe_route_quantize"
(variants as moe_route's: the route and hidden's quantization in one launch), the combine image and the two GEMMs'
FP8 builds (weight_format "fp8"), cubins only (no PTX: sm_80 has no FP8), for FP8
architectures only (options.FP8_ARCHS; others are refused as aot.grouped_mm_images refuses them).
fp8_down_candidate_image and fp8_down_wgmma_image build moe_fp8_down.py's down GEMM candidates under the shipped
down's name ("moe_down") for benchmarks/device/prepare.py's sweep; they ship in no image set.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from et_trt_backend.kernels import aot, int4_mma, parallel_compile, sm90
from et_trt_backend.kernels.images import cached_image
from et_trt_backend.serialization.kernel_image import KernelImage

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MoEGemmConfig:
    """One tiling of the two GEMMs: BLOCK_M rows of a tile (shared), columns and K per stage for each GEMM."""

    variant: str
    block_m: int
    gate_up_n: int  # features per tile (gated: per accumulator, so the tile reads 2x this many weight rows)
    down_n: int
    block_k: int
    num_stages: int
    num_warps: int
    k_n_multiple: int  # H and F must be multiples of this (16-byte rows for vector loads); 1 = any


# In the launcher's order of preference by rows per expert (moe_experts_launcher.cc): "small" for robot batches
# (one to a few tokens per expert: the weights' stream is the work, so narrow tiles spread it over more
# multiprocessors), "tile" for tens of rows, "large" for hundreds; "any" for H or F not a multiple of 16.
# Sized for the smallest shared memory of the architectures (99 KiB: sm_86, sm_89, sm_120).
MOE_GEMM_CONFIGS = (
    MoEGemmConfig("small", 16, 64, 64, 64, 4, 4, 16),
    MoEGemmConfig("tile", 64, 64, 64, 64, 3, 4, 16),
    MoEGemmConfig("large", 128, 64, 128, 64, 3, 8, 16),
    MoEGemmConfig("any", 32, 32, 32, 32, 2, 4, 1),
)
# The INT4 builds' tilings: the same with one packed 32-element chunk per step.
INT4_GEMM_CONFIGS = tuple(dataclasses.replace(config, block_k=32) for config in MOE_GEMM_CONFIGS)


@dataclasses.dataclass(frozen=True)
class MoEGemvConfig:
    """The INT4 vector-matrix kernels' blocking: weight rows (features, for gate+up) per program, 32-element chunks
    per step."""

    variant: str
    block_n: int
    block_c: int
    num_warps: int
    num_stages: int
    k_n_multiple: int
    paired: bool = False  # gated gate+up: gate and up rows in one loop (int4_kernels.py's PAIRED)


# 4 weight rows x 32 chunks (1024 elements of K) per step, 2 warps, loads 2 deep, gate and up rows in one loop: the
# fastest of the 17 blockings an H100 sweep timed (benchmarks/results/h100_int4/sweep/, sm_90a bf16 "gemv"), ranked
# on the shapes the launcher runs on this path (1-4 tokens at 8 and 16 experts, 1-32 at 64): 1.023x the best
# blocking per shape (geometric mean; worst 1.06x), 1.09x faster than the first blocking (8 rows x 256, 3 deep,
# two loops). Few pairs make few programs: fewer rows and longer runs of K each keep more bytes in flight.
# "gemv_any" takes the same blocking (not timed on its own).
MOE_GEMV_CONFIGS = (MoEGemvConfig("gemv", 4, 32, 2, 2, 16, paired=True),
                    MoEGemvConfig("gemv_any", 4, 32, 2, 2, 1, paired=True))
# The mma.sync kernels' builds (int4_mma.py's MmaConfig: warps, 16-row weight tiles per warp, pairs per pass, 32-element
# chunks of K per stage, stages, by_expert; gate+up, down): two families, the first-pair grid (pairs across) and
# BY_EXPERT (experts across), each a build per pass size; the launcher (moe_experts_launcher.cc's int4_mma_by_expert)
# picks the family by pairs per expert, expert count and weight size, then the fewest pairs per pass that hold twice
# the average expert's. Each the fastest of its family and pass size where the launcher runs it, in the H100 sweeps
# (benchmarks/results/h100_int4/: sweep3 for the first-pair builds, sweeps 4 and 5 for BY_EXPERT, 7 expert shapes x
# 4-256 tokens): the first-pair grid's 32-pair build is gone (the rule gives it no shape: BY_EXPERT serves 8+ pairs
# per expert); BY_EXPERT's 64-pair build takes 128 gate+up rows and 128 down rows by 8 warps (where the rule runs it,
# 256 tokens on 8 and 16 experts: 1.03x-1.16x its 32-pair build, 0.98x on 8x2048x4096; with a 64-row down 3-6% slower
# but on 8x1024x1024, 4% faster).
MOE_MMA_CONFIGS = ((int4_mma.MmaConfig(4, 1, 8, 4, 4), int4_mma.MmaConfig(4, 1, 8, 4, 4)),
                   (int4_mma.MmaConfig(4, 2, 16, 4, 4), int4_mma.MmaConfig(4, 1, 16, 4, 4)),
                   (int4_mma.MmaConfig(4, 1, 8, 4, 4, by_expert=True),
                    int4_mma.MmaConfig(4, 1, 8, 4, 4, by_expert=True)),
                   (int4_mma.MmaConfig(4, 2, 16, 4, 4, by_expert=True),
                    int4_mma.MmaConfig(4, 1, 16, 4, 4, by_expert=True)),
                   (int4_mma.MmaConfig(4, 1, 32, 4, 3, by_expert=True),
                    int4_mma.MmaConfig(4, 1, 32, 4, 3, by_expert=True)),
                   (int4_mma.MmaConfig(8, 1, 64, 4, 3, by_expert=True),
                    int4_mma.MmaConfig(8, 1, 64, 4, 3, by_expert=True)))
# The FP8 builds' tilings (moe_fp8.py): the gate+up always takes 128 features (one scale block of its output); the
# down's K steps of block_k lie within one scale block (128). "large" is sm_90a's alone: on sm_100a its gated gate+up
# spills (both 128 x 128 accumulators leave tensor memory for the epilogue). Architectures of 99 KiB shared memory
# (sm_89, sm_120) take two stages and "tile" of 32 rows (_fp8_configs). "any" (masked byte loads, no cp.async: a pointer
# per element) takes K steps of 32 and runs unpipelined: with 128 or two stages its gated gate+up spills.
# "large" (the MoE shapes' tiling) loads 4 stages deep (192 KiB for the gated gate+up): the fastest of the H100 sweep
# (benchmarks/results/h100_moe_fp8acc/: 3 stages, K steps of 64 with 4 or 6 stages, a 64-column down, 64-row tiles),
# 3141 / 7236 us against 3 stages' 3307 / 7356 at 3500 / 8740 tokens (gate+up -9%, down -6%).
FP8_GEMM_CONFIGS = (
    MoEGemmConfig("small", 16, 128, 64, 128, 3, 4, 16),
    MoEGemmConfig("tile", 64, 128, 128, 128, 3, 8, 16),
    MoEGemmConfig("large", 128, 128, 128, 128, 4, 8, 16),
    MoEGemmConfig("any", 16, 128, 32, 32, 1, 8, 1),
)
# sm_90a's bf16 "large" down is moe_fp8_down.py's Gluon kernel with its wgmma waits explicit: 5 stages, 4 scale blocks
# per iteration. On an H100 it gave the FP8 block 1.025x / 1.050x at 3500 / 8740 tokens over the Triton down (paired
# medians; its down 1280 / 2648 us against 1355 / 3023), bit-identical results in the device's checks (one token, odd
# H and F, skewed routing with empty experts and invalid ids, biases, F 3072): benchmarks/results/h100_moe_fp8_sweep/.
# fp16 keeps the Triton down (not measured); Gluon has no interpreter, so the CPU tests check the Triton one.
FP8_LARGE_DOWN_WGMMA = (5, 4)  # (stages, scale blocks per iteration)
_SMALL_SMEM_CAPS = (89, 120)
# Tokens of hidden per quantizing program of moe_route_quantize. Each thread divides once per token (the scale, IEEE
# division with its slow path as a call): with 16, sm_120a's e1024 variant spilled 4 registers.
FP8_QUANTIZE_TOKENS = 8
FP8_ROUTE_WARPS = 8  # with 4, moe_route_quantize e256 spills a register on sm_90a
# The route kernel's variants: experts it holds (E <= E_PAD) and pairs per program.
MOE_ROUTE_CONFIGS = {"e64": (64, 256), "e256": (256, 1024), "e1024": (1024, 1024)}
COMBINE_BLOCK = (8, 256)  # tokens x columns per program
GATHER_BLOCK = (16, 128)  # rows x columns per program (16 x 256 spilled a register pair to local memory on sm_90a)
_NUM_WARPS = 4  # route and combine


def _compile(kernel_name: str, variant: str, function, signature: dict, constexprs: dict, multiples: dict,
             arch: str, dtype: str, fmt: str, num_warps: int, num_stages: int, blocks: tuple[int, int, int],
             weight_format: str = "dense"):
    """One image, from the disk cache where there; `multiples` maps argument names to a divisibility. A kernel that
    can wait for the grid before it (a WAIT_PRIOR_GRID parameter) does so where aot.waits_for_prior_grid says, and
    its image says so."""
    import triton

    if "WAIT_PRIOR_GRID" in function.arg_names:
        signature = {**signature, "WAIT_PRIOR_GRID": "constexpr"}
        constexprs = {**constexprs, "WAIT_PRIOR_GRID": aot.waits_for_prior_grid(arch, fmt)}
    cap = aot._capability(arch)
    ptx_version = aot._FP8_PTX_VERSION.get(cap, aot._PTX_VERSION[cap]) if weight_format == "fp8" else \
        aot._PTX_VERSION[cap]
    names = list(signature)
    module = function.fn.__module__.rsplit(".", 1)[-1]
    # The function's own name too: one module may hold several kernels built under one image name (the FP8 down's
    # sweep candidates are all "moe_down").
    key = [aot._source_hash(*aot.KERNEL_SOURCES[module]), triton.__version__, cap, dtype, fmt, kernel_name,
           function.fn.__name__, variant, sorted(constexprs.items()), sorted(multiples.items()), num_warps, num_stages,
           ptx_version, weight_format, "no line info"]

    def build() -> KernelImage:
        logger.info("compiling %s (%s) for %s (%s, %s)", kernel_name, variant, arch, dtype, fmt)
        attrs = {(names.index(name),): [["tt.divisibility", multiple]] for name, multiple in multiples.items()
                 if signature[name] != "constexpr"}  # dense builds' INT4 parameters are constexprs
        compiled = aot._triton_compile(function, signature, constexprs, attrs, cap, num_warps, num_stages,
                                       ptx_version)
        image = aot._image(compiled, kernel=kernel_name, variant=variant, trans_b=True, cap=cap, fmt=fmt,
                           dtype=dtype, block_m=blocks[0], block_n=blocks[1], block_k=blocks[2], persistent=False,
                           ptx_version=ptx_version, weight_format=weight_format)
        return dataclasses.replace(image, waits_for_prior_grid=bool(constexprs.get("WAIT_PRIOR_GRID", False)))

    return cached_image(key, build)


def _pointers(names: str, dtype: str) -> dict:
    """Signature entries "name:type" with type i32, f32, u8 (packed INT4 weights), bf16 (their scales) or x (the
    activations' dtype) for pointers."""
    types = {"i32": "*i32", "f32": "*fp32", "u8": "*u8", "bf16": "*bf16", "f8": "*fp8e4nv", "x": "*" + dtype}
    return {name: types[kind] for name, kind in (entry.split(":") for entry in names.split())}


# Pointer arguments the launcher passes 16-byte aligned.
_ALIGNED = {name: 16 for name in ("x_ptr", "sorted_ptr", "w_ptr", "bias_ptr", "tiles_ptr", "offs_ptr", "h_ptr",
                                  "weights_ptr", "y_ptr", "ids_ptr", "out_ptr", "scale_ptr", "w_scale_ptr",
                                  "h_scale_ptr", "xq_ptr", "xs_ptr")}


def _route_and_combine(arch: str, dtype: str, fmt: str) -> list[KernelImage]:
    from et_trt_backend.kernels import moe_experts as source

    images = []
    for variant, (e_pad, chunk) in MOE_ROUTE_CONFIGS.items():
        signature = {**_pointers("ids_ptr:i32 offs_ptr:i32 sorted_ptr:i32 tiles_ptr:i32", dtype),
                     "pairs": "i32", "E": "i32", "block_m": "i32", "CHUNK": "constexpr", "E_PAD": "constexpr"}
        # It reads no activations: compiled once, tagged with the dtype of the images it ships with.
        route = _compile("moe_route", variant, source.moe_route_kernel, signature, {"CHUNK": chunk, "E_PAD": e_pad},
                         {n: 16 for n in signature if n.endswith("_ptr")}, arch, aot.DTYPES[0], fmt, _NUM_WARPS, 1,
                         (0, e_pad, chunk))
        images.append(dataclasses.replace(route, dtype=dtype))
    return images + [_combine_image(arch, dtype, fmt)]


def _combine_image(arch: str, dtype: str, fmt: str, y_in_dtype: bool = False) -> KernelImage:
    """The combine of float32 rows y, or (y_in_dtype: variant "y_in_dtype") of rows in `dtype`."""
    from et_trt_backend.kernels import moe_experts as source

    signature = {**_pointers(f"y_ptr:{'x' if y_in_dtype else 'f32'} ids_ptr:i32 out_ptr:x", dtype), "T": "i32",
                 "H": "i32", "top_k": "i32", "E": "i32", "BLOCK_T": "constexpr", "BLOCK_H": "constexpr"}
    image = _compile("moe_combine", "y_in_dtype" if y_in_dtype else "any", source.moe_combine_kernel, signature,
                     {"BLOCK_T": COMBINE_BLOCK[0], "BLOCK_H": COMBINE_BLOCK[1]},
                     {n: 16 for n in signature if n.endswith("_ptr")}, arch, dtype, fmt, _NUM_WARPS, 1,
                     (COMBINE_BLOCK[0], COMBINE_BLOCK[1], 0))
    return dataclasses.replace(image, y_in_dtype=y_in_dtype)


def combine_y_in_dtype_images(arch: str, dtype: str) -> list[KernelImage]:
    """The combine after the wgmma kernel's MoE down, which writes its rows in `dtype` (sm90.image's y_in_dtype)."""
    return [_combine_image(arch, dtype, "cubin", y_in_dtype=True)]


def gemm_images(arch: str, dtype: str, fmt: str, weight_format: str = "dense",
                configs: Sequence[MoEGemmConfig] | None = None) -> list[KernelImage]:
    """Each tiling's gate+up (non-gated and gated) and down; INT4 ones take the packed weights and their scales.
    `configs`: other tilings than the shipped ones (benchmarks/device/prepare.py's sweep)."""
    from et_trt_backend.kernels import moe_experts as source

    int4 = weight_format == "int4"
    weights = "w_ptr:u8" if int4 else "w_ptr:x"
    # Dense builds take the INT4 parameters as constexprs (not parameters of the compiled kernel).
    quantized = {"scale_ptr": "*bf16", "group_size": "i32"} if int4 else {"scale_ptr": "constexpr",
                                                                          "group_size": "constexpr"}
    constants = {"INT4": int4} if int4 else {"scale_ptr": None, "group_size": 0, "INT4": False}
    images = []
    for config in configs or (INT4_GEMM_CONFIGS if int4 else MOE_GEMM_CONFIGS):
        sizes = {"H": config.k_n_multiple, "F": config.k_n_multiple} if config.k_n_multiple > 1 else {}
        for gated in (False, True):
            signature = {**_pointers(f"x_ptr:x sorted_ptr:i32 {weights} bias_ptr:x tiles_ptr:i32 offs_ptr:i32 h_ptr:x",
                                     dtype),
                         "H": "i32", "F": "i32", "top_k": "i32", "layout_block": "i32", "activation": "i32",
                         "alpha": "fp32", "limit": "fp32", "has_bias": "i32", "GATED": "constexpr",
                         "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **quantized,
                         "INT4": "constexpr"}
            constexprs = {"GATED": gated, "BLOCK_M": config.block_m, "BLOCK_N": config.gate_up_n,
                          "BLOCK_K": config.block_k, **constants}
            images.append(_compile("moe_gate_up_gated" if gated else "moe_gate_up", config.variant,
                                   source.moe_gate_up_kernel, signature, constexprs,
                                   {**{n: 16 for n in signature if n in _ALIGNED}, **sizes}, arch, dtype, fmt,
                                   config.num_warps, config.num_stages,
                                   (config.block_m, config.gate_up_n, config.block_k), weight_format))
        signature = {**_pointers(f"h_ptr:x sorted_ptr:i32 {weights} bias_ptr:x weights_ptr:f32 tiles_ptr:i32 "
                                 "offs_ptr:i32 y_ptr:f32", dtype),
                     "H": "i32", "F": "i32", "has_bias": "i32", "weights_16bit": "i32", "BLOCK_M": "constexpr",
                     "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **quantized, "INT4": "constexpr"}
        constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.down_n, "BLOCK_K": config.block_k, **constants}
        images.append(_compile("moe_down", config.variant, source.moe_down_kernel, signature, constexprs,
                               {**{n: 16 for n in signature if n in _ALIGNED}, **sizes}, arch, dtype, fmt,
                               config.num_warps, config.num_stages, (config.block_m, config.down_n, config.block_k),
                               weight_format))
    return images


def _fp8_configs(arch: str) -> tuple[MoEGemmConfig, ...]:
    """FP8_GEMM_CONFIGS for sm_90a; elsewhere without "large", and on 99 KiB architectures with two stages and
    "tile" of 32 rows: their mma.sync (no wgmma) gated gate+up of 64 rows spilled (3-5 registers, sm_89, sm_120a)."""
    cap = aot._capability(arch)
    configs = FP8_GEMM_CONFIGS if cap == 90 else tuple(c for c in FP8_GEMM_CONFIGS if c.variant != "large")
    if cap in _SMALL_SMEM_CAPS:
        return tuple(dataclasses.replace(config, num_stages=min(config.num_stages, 2),
                                         block_m=32 if config.variant == "tile" else config.block_m)
                     for config in configs)
    return configs


def fp8_route_signature(dtype: str) -> dict:
    """moe_fp8.moe_fp8_route_kernel's signature (its constexprs CHUNK, E_PAD, BLOCK_T)."""
    return {**_pointers("ids_ptr:i32 offs_ptr:i32 sorted_ptr:i32 tiles_ptr:i32", dtype), "pairs": "i32", "E": "i32",
            "block_m": "i32", **_pointers("x_ptr:x xq_ptr:f8 xs_ptr:f32", dtype), "T": "i32", "H": "i32",
            "route_programs": "i32", "CHUNK": "constexpr", "E_PAD": "constexpr", "BLOCK_T": "constexpr"}


def _fp8_images(arch: str, dtype: str) -> list[KernelImage]:
    """The route + quantization variants, the combine, each FP8 tiling's gate+up (non-gated and gated) and down
    (moe_fp8.py), cubins."""
    from et_trt_backend.kernels import moe_fp8 as source

    images = []
    for variant, (e_pad, chunk) in MOE_ROUTE_CONFIGS.items():
        signature = fp8_route_signature(dtype)
        images.append(_compile("moe_route_quantize", variant, source.moe_fp8_route_kernel, signature,
                               {"CHUNK": chunk, "E_PAD": e_pad, "BLOCK_T": FP8_QUANTIZE_TOKENS},
                               {n: 16 for n in signature if n.endswith("_ptr")}, arch, dtype, "cubin",
                               FP8_ROUTE_WARPS, 1, (FP8_QUANTIZE_TOKENS, e_pad, chunk), "fp8"))
    return images + [_combine_image(arch, dtype, "cubin")] + fp8_gemm_images(arch, dtype, _fp8_configs(arch))


def fp8_gemm_images(arch: str, dtype: str, configs: Sequence[MoEGemmConfig]) -> list[KernelImage]:
    """Each tiling's FP8 gate+up (non-gated and gated) and down (moe_fp8.py), cubins; benchmarks/device/prepare.py
    builds other tilings than FP8_GEMM_CONFIGS with it (sweep candidates)."""
    from et_trt_backend.kernels import moe_fp8 as source

    images = []
    for config in configs:
        sizes = {"H": config.k_n_multiple, "F": config.k_n_multiple} if config.k_n_multiple > 1 else {}
        for gated in (False, True):
            signature = {**_pointers("xq_ptr:f8 xs_ptr:f32 sorted_ptr:i32 w_ptr:f8 w_scale_ptr:f32 bias_ptr:x "
                                     "tiles_ptr:i32 offs_ptr:i32 h_ptr:f8 h_scale_ptr:f32", dtype),
                         "H": "i32", "F": "i32", "top_k": "i32", "layout_block": "i32", "activation": "i32",
                         "alpha": "fp32", "limit": "fp32", "has_bias": "i32", "GATED": "constexpr",
                         "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
            constexprs = {"GATED": gated, "BLOCK_M": config.block_m, "BLOCK_N": config.gate_up_n,
                          "BLOCK_K": config.block_k}
            images.append(_compile("moe_gate_up_gated" if gated else "moe_gate_up", config.variant,
                                   source.moe_fp8_gate_up_kernel, signature, constexprs,
                                   {**{n: 16 for n in signature if n in _ALIGNED}, **sizes}, arch, dtype, "cubin",
                                   config.num_warps, config.num_stages,
                                   (config.block_m, config.gate_up_n, config.block_k), "fp8"))
        images.append(_fp8_down(arch, dtype, config))
    return images


def _fp8_down(arch: str, dtype: str, config: MoEGemmConfig) -> KernelImage:
    """The shipped FP8 down of a tiling: moe_fp8.py's, or the Gluon one for sm_90a's bf16 "large"
    (FP8_LARGE_DOWN_WGMMA)."""
    from et_trt_backend.kernels import moe_fp8 as source

    if aot._capability(arch) == 90 and dtype == "bf16" and config.variant == "large":
        stages, step = FP8_LARGE_DOWN_WGMMA
        return fp8_down_wgmma_image(dtype, dataclasses.replace(config, num_stages=stages), step)
    return _fp8_down_image(arch, dtype, config, source.moe_fp8_down_kernel, {})


def fp8_down_signature(dtype: str, constexprs: Sequence[str] = ()) -> dict:
    """moe_fp8.moe_fp8_down_kernel's signature (its constexprs BLOCK_M, BLOCK_N, BLOCK_K), plus `constexprs` (a
    sweep candidate's, moe_fp8_down.py)."""
    return {**_pointers("h_ptr:f8 h_scale_ptr:f32 sorted_ptr:i32 w_ptr:f8 w_scale_ptr:f32 bias_ptr:x "
                        "weights_ptr:f32 tiles_ptr:i32 offs_ptr:i32 y_ptr:f32", dtype),
            "H": "i32", "F": "i32", "has_bias": "i32", "weights_16bit": "i32", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **{name: "constexpr" for name in constexprs}}


def _fp8_down_image(arch: str, dtype: str, config: MoEGemmConfig, kernel, constexprs: dict) -> KernelImage:
    """One FP8 down image of `kernel` (moe_fp8.py's moe_fp8_down_kernel, or a sweep candidate taking the same
    arguments plus `constexprs`)."""
    signature = fp8_down_signature(dtype, list(constexprs))
    sizes = {"H": config.k_n_multiple, "F": config.k_n_multiple} if config.k_n_multiple > 1 else {}
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.down_n, "BLOCK_K": config.block_k, **constexprs}
    return _compile("moe_down", config.variant, kernel, signature, constexprs,
                    {**{n: 16 for n in signature if n in _ALIGNED}, **sizes}, arch, dtype, "cubin", config.num_warps,
                    config.num_stages, (config.block_m, config.down_n, config.block_k), "fp8")


def fp8_down_candidate_image(arch: str, dtype: str, config: MoEGemmConfig, split_k: bool) -> KernelImage:
    """A sweep candidate's FP8 down image (benchmarks/device/prepare.py's FP8_DOWN_CANDIDATES): moe_fp8_down.py's
    moe_fp8_down_candidate_kernel, config.block_k 64 with split_k, else 128; the launcher takes it as the shipped down
    of config's variant (same arguments, grid and rows per tile)."""
    from et_trt_backend.kernels import moe_fp8_down as source

    return _fp8_down_image(arch, dtype, config, source.moe_fp8_down_candidate_kernel, {"SPLIT_K": split_k})


def fp8_down_wgmma_image(dtype: str, config: MoEGemmConfig, step: int) -> KernelImage:
    """A sweep candidate's FP8 down image for sm_90a: moe_fp8_down.py's Gluon moe_fp8_down_wgmma_kernel with
    config.num_stages stages and `step` scale blocks per iteration (config.block_k 128, block_m 16 per warp)."""
    from et_trt_backend.kernels import moe_fp8_down as source

    return _fp8_down_image("sm_90a", dtype, config, source.moe_fp8_down_wgmma_kernel,
                           {"STAGES": config.num_stages, "STEP": step})


def gemv_images(arch: str, dtype: str, fmt: str, configs=MOE_GEMV_CONFIGS) -> list[KernelImage]:
    """The INT4 vector-matrix kernels (int4_kernels.py) of each blocking, by pair with no route: gate+up (non-gated
    and gated), down, and the down and combine in one launch ("moe_gemv_down_combine")."""
    from et_trt_backend.kernels import int4_kernels

    images = []
    for config in configs:
        sizes = {"H": config.k_n_multiple, "F": config.k_n_multiple} if config.k_n_multiple > 1 else {}
        blocks = {"BLOCK_N": config.block_n, "BLOCK_C": config.block_c}
        gate_up, down = int4_kernels.moe_int4_gemv_gate_up_kernel, int4_kernels.moe_int4_gemv_down_kernel

        def compile_one(kernel_name, function, signature, constexprs):
            signature |= {name: "constexpr" for name in constexprs}
            images.append(_compile(kernel_name, config.variant, function, signature, constexprs,
                                   {**{n: 16 for n in signature if n in _ALIGNED}, **sizes}, arch, dtype, fmt,
                                   config.num_warps, config.num_stages,
                                   (1, config.block_n, 32 * config.block_c), "int4"))

        for gated in (False, True):
            paired = {"PAIRED": gated and config.paired}
            compile_one("moe_gemv_gate_up_gated" if gated else "moe_gemv_gate_up", gate_up,
                        {**_pointers("x_ptr:x ids_ptr:i32 w_ptr:u8 scale_ptr:bf16 bias_ptr:x h_ptr:x", dtype),
                         "pairs": "i32", "E": "i32", "H": "i32", "F": "i32", "top_k": "i32", "layout_block": "i32",
                         "group_size": "i32", "activation": "i32", "alpha": "fp32", "limit": "fp32",
                         "has_bias": "i32"}, {"GATED": gated, **blocks, **paired})
        down_pointers = "h_ptr:x ids_ptr:i32 w_ptr:u8 scale_ptr:bf16 bias_ptr:x weights_ptr:f32"
        compile_one("moe_gemv_down", down, {**_pointers(down_pointers + " y_ptr:f32", dtype), "pairs": "i32",
                                            "E": "i32", "H": "i32", "F": "i32", "group_size": "i32",
                                            "has_bias": "i32", "weights_16bit": "i32"}, blocks)
        compile_one("moe_gemv_down_combine", int4_kernels.moe_int4_gemv_down_combine_kernel,
                    {**_pointers(down_pointers + " out_ptr:x", dtype), "T": "i32", "E": "i32", "H": "i32", "F": "i32",
                     "top_k": "i32", "group_size": "i32", "has_bias": "i32", "weights_16bit": "i32"}, blocks)
    return images


def arch_images(arch: str, dtype: str, fmt: str, weight_format: str = "dense") -> list[KernelImage]:
    """moe_experts_images' Triton images of one architecture (and INT4's nvcc mma.sync builds), cubins or (fmt
    "ptx") the portable fallback's."""
    if weight_format == "fp8":
        return _fp8_images(arch, dtype)
    images = _route_and_combine(arch, dtype, fmt) + gemm_images(arch, dtype, fmt, weight_format)
    if weight_format == "int4":
        images += gemv_images(arch, dtype, fmt) + _mma_images(arch, dtype, fmt)
    return images


def _mma_images(arch: str, dtype: str, fmt: str) -> list[KernelImage]:
    """The INT4 mma.sync kernels (int4_mma.py); [] without nvcc (the launcher's tiles serve their pairs)."""
    if sm90.nvcc_path() is None:
        logger.warning("nvcc not found: the INT4 images lack the mma.sync kernels (the tiles serve their shapes)")
        return []
    return [image for gate_up, down in MOE_MMA_CONFIGS for image in int4_mma.images(arch, dtype, gate_up, down, fmt)]


def _sm90_sets(arch: str, dtype: str) -> list[parallel_compile.Set]:
    """The wgmma kernel's MoE builds and the row gather before them; none without nvcc (the Triton tilings serve)."""
    if sm90.nvcc_path() is None:
        logger.warning("nvcc not found: the sm_90a MoE images lack the wgmma kernel (the Triton tilings serve)")
        return []
    return [("sm90", (dtype, "dense", "gate_up")), ("sm90", (dtype, "dense", "down")), ("moe_gather", (arch, dtype)),
            ("moe_combine_y_in_dtype", (arch, dtype))]


def gather_images(arch: str, dtype: str) -> list[KernelImage]:
    """The row gather before the wgmma kernel's MoE builds."""
    from et_trt_backend.kernels import moe_experts as source

    signature = {**_pointers("x_ptr:x sorted_ptr:i32 offs_ptr:i32 a_ptr:x", dtype), "H": "i32", "E": "i32",
                 "top_k": "i32", "BLOCK_R": "constexpr", "BLOCK_H": "constexpr"}
    return [_compile("moe_gather", "any", source.moe_gather_kernel, signature,
                     {"BLOCK_R": GATHER_BLOCK[0], "BLOCK_H": GATHER_BLOCK[1]},
                     {n: 16 for n in signature if n.endswith("_ptr")}, arch, dtype, "cubin", _NUM_WARPS, 1,
                     (GATHER_BLOCK[0], GATHER_BLOCK[1], 0))]


def moe_experts_images(archs: Sequence[str], dtype: str, weight_format: str = "dense") -> list[KernelImage]:
    """Cubins of every MoE experts kernel for each architecture, plus the sm_80 ones as portable PTX; weight_format
    "int4": those of INT4 expert weights, "fp8": those of FP8 ones, cubins only (the module docstring).
    Architectures the installed compiler cannot target are skipped with a warning, as aot.grouped_mm_images
    does."""
    if dtype not in aot.DTYPES:
        raise ValueError(f"unsupported kernel dtype {dtype!r}; use one of {aot.DTYPES}")
    if weight_format not in ("dense", "int4", "fp8"):
        raise ValueError(f"MoE experts kernels take weight_format 'dense', 'int4' or 'fp8', not {weight_format!r}")
    caps = [aot._capability(a) for a in archs]  # validates every name first
    if weight_format == "fp8":
        for arch in archs:
            aot._check_fp8_arch(arch)
    supported = aot._compiler_targets()
    sets = []
    for arch, cap in zip(archs, caps):
        if cap not in supported:
            logger.warning("skipping kernel architecture %s: the installed Triton/ptxas cannot target it", arch)
            continue
        logger.info("MoE experts kernels for %s (%s, %s weights)", arch, dtype, weight_format)
        sets.append(("moe_experts", (arch, dtype, "cubin", weight_format)))
        if cap == 90 and weight_format == "dense":
            sets += _sm90_sets(arch, dtype)
        if cap == 90 and weight_format == "fp8" and sm90.nvcc_path() is not None:  # the wgmma kernel's FP8 down
            sets += [("sm90", (dtype, "fp8", "down")), ("moe_combine_y_in_dtype", (arch, dtype))]
    if weight_format != "fp8":  # no portable FP8 fallback: the PTX architecture has no FP8 MMA
        sets.append(("moe_experts", (aot.PTX_FALLBACK_ARCH, dtype, "ptx", weight_format)))
    return parallel_compile.images(sets)
