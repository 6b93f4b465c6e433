"""Compile options of one partition: the typed, validated schema.

This is the one definition of every option a recipe may set. The partitioner
validates recipes against it, preprocess reads it back from the partition's
compile specs, and the serializer writes the build options (the fields declared
with build_option: the C++ builder applies them) into the blob as typed
name/value entries (serialization/schema.fbs, table BuildOption). The runtime's
build generates its table of build options, with their types, ranges, choices
and defaults, from this file (runtime/cmake/build_options_header.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # imported where specs are made: reading a blob's options needs no ExecuTorch
    from executorch.exir.backend.compile_spec_schema import CompileSpec

# Key of the one compile spec that carries a partition's options (JSON).
OPTIONS_SPEC_KEY = "et_trt.options"
# Key of the compile spec naming the model part a partition belongs to.
PART_SPEC_KEY = "et_trt.part"

PRECISIONS = ("bf16", "fp16", "fp32")
# expert_precision: "fp8" quantizes the weights of every MoE block (fused MoEExperts and GroupedMM alike) to FP8 e4m3
# with a float32 scale per output channel; "int4" to INT4 with a bf16 scale per int4_group_size elements along K;
# "precision" (what leaving it out means) keeps them in the part's precision, and lets a part undo a [default] "fp8"
# or "int4".
EXPERT_PRECISIONS = ("fp8", "int4", "precision")
# int4_group_size: the INT4 scale groups' size along K (int4_weights.GROUP_SIZES; no import: reading a blob's options
# needs no torch); unset means DEFAULT_INT4_GROUP_SIZE.
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_INT4_GROUP_SIZE = 128
ENGINE_BUILD_POLICIES = ("auto", "always", "never")
PREFLIGHT_POLICIES = ("error", "warn")
# Architectures the grouped-GEMM kernel can be compiled for, named as the
# kernel images are: from sm_90 on, the arch-specific "a" targets (wgmma on
# sm_90a, tcgen05 on sm_100a/sm_110a, Triton's sm_120a).
KERNEL_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90a", "sm_100a", "sm_110a", "sm_120a")
DEFAULT_KERNEL_ARCHS = ("sm_80", "sm_87", "sm_90a", "sm_100a", "sm_110a", "sm_120a")
# Architectures without FP8 tensor cores (Ampere, Jetson Orin): FP8 experts are refused for them (no weight-only
# FP8 kernel yet), for a recipe here and for a kernel image in kernels/aot.py, both through without_fp8.
NO_FP8_ARCHS = ("sm_80", "sm_86", "sm_87")
FP8_ARCHS = tuple(arch for arch in KERNEL_ARCHS if arch not in NO_FP8_ARCHS)
# The INT4 rule, here beside it: INT4 experts are weight-only (dequantized to the part's precision in registers for
# mma.sync or FMA), so every architecture of KERNEL_ARCHS runs them, Orin's sm_87 included; none is refused.
# TensorRT's builder optimization levels.
OPTIMIZATION_LEVELS = range(0, 6)
# An int64 of the blob: a size in bytes at least 1.
POSITIVE_INT64 = range(1, 1 << 63)

_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


class OptionsError(ValueError):
    """A recipe or option value is invalid; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class ShapeRange:
    """Range of one dynamic dimension for TensorRT's optimization profile."""

    min: int
    opt: int
    max: int

    def to_json(self) -> dict[str, int]:
        return {"min": self.min, "opt": self.opt, "max": self.max}


@dataclasses.dataclass(frozen=True)
class BuildOption:
    """The type of an option the C++ builder applies (runtime/src/tensorrt/tensorrt_builder.cc, `configure`) and
    the values it may take: checked here when a recipe sets it, and by the runtime when it reads a blob."""

    kind: type  # bool, int, or str: one of `values`
    values: range | tuple[str, ...] | None = None  # an int's range or a str's choices

    def check(self, key: str, value: Any) -> Any:
        if self.kind is str:
            return _choice(key, value, self.values)
        if self.kind is bool:
            return _expect(key, value, bool, "true or false")
        bounds = f"{self.values[0]}-{self.values[-1]}"
        _expect(key, value, int, f"an integer {bounds}")
        if value not in self.values:
            raise OptionsError(f"option '{key}': must be an integer {bounds}, got {value}")
        return value


def build_option(default: Any, kind: type, values: range | tuple[str, ...] | None = None) -> Any:
    """A CompileOptions field the blob carries to the C++ builder; a default of None means no entry (the builder's
    own default)."""
    if (kind is int) != isinstance(values, range) or (kind is str) != isinstance(values, tuple):
        raise TypeError(f"build_option: an int needs its range, a str its choices, a bool neither; got "
                        f"{kind.__name__} with {values!r}")
    return dataclasses.field(default=default, metadata={"build": BuildOption(kind, values)})


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Options of one partition (one TensorRT engine)."""

    # The dtype the partition computes in, written into its ONNX (lowering/precision.py: the model's
    # bf16/fp16 becomes it, float32 islands stay); tf32 lets fp32 layers use TF32 math.
    precision: str = "bf16"
    tf32: bool = build_option(True, bool)
    # TensorRT has no float64: on (as Torch-TensorRT's truncate_double), the part's float64 computations run in
    # float32 (lowering/precision.py narrows them and logs each op); off, float64 ops stay on ExecuTorch.
    truncate_double: bool = True
    # Per dynamic dimension, by its torch.export Dim name (or "input:axis").
    # Dimensions not named here take the exported program's range constraints.
    shape_ranges: Mapping[str, ShapeRange] = dataclasses.field(default_factory=dict)
    # TensorRT builder workspace limit in bytes; None leaves TensorRT's default.
    workspace_bytes: int | None = build_option(None, int, POSITIVE_INT64)
    optimization_level: int = build_option(3, int, OPTIMIZATION_LEVELS)
    timing_cache: str | None = None
    # Architectures to compile the grouped-GEMM kernel images for.
    kernel_archs: tuple[str, ...] = DEFAULT_KERNEL_ARCHS
    # Off: aten._grouped_mm lowers densely in TensorRT-native ops instead.
    grouped_gemm_kernel: bool = True
    # Each MoE block the lowering recognises becomes one fused MoEExperts node (lowering/moe_fusion.py); off (or
    # where a block is not recognised), its experts are two GroupedMM nodes and the routing ops around them.
    fused_experts: bool = True
    # "fp8": every MoE block's expert weights (MoEExperts and GroupedMM) become FP8 e4m3 with a scale per expert
    # output channel (lowering/fp8_experts.py); "int4": INT4 with a bf16 scale per group of int4_group_size along K
    # (lowering/int4_experts.py), activations and outputs staying in `precision`; None: they stay in `precision`.
    expert_precision: str | None = None
    # INT4 only (None: DEFAULT_INT4_GROUP_SIZE); a part whose experts are not INT4 ignores it, with a warning.
    int4_group_size: int | None = None
    # Build the engine at export: auto (if TensorRT and a GPU are present),
    # always (fail otherwise) or never (the robot builds it from the ONNX).
    engine_build: str = "auto"
    # What the TensorRT pre-flight check does with a violation.
    preflight: str = "error"

    # ---- serialization -------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape_ranges"] = {k: v.to_json() for k, v in sorted(self.shape_ranges.items())}
        out["kernel_archs"] = list(self.kernel_archs)
        return out

    def to_compile_specs(self, part: str) -> list[CompileSpec]:
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        payload = json.dumps(self.to_json(), sort_keys=True).encode()
        return [CompileSpec(OPTIONS_SPEC_KEY, payload), CompileSpec(PART_SPEC_KEY, part.encode())]

    @classmethod
    def from_compile_specs(cls, specs: list[CompileSpec]) -> tuple["CompileOptions", str]:
        """Options and part name of a partition, as preprocess receives them."""
        by_key = {s.key: s.value for s in specs}
        if OPTIONS_SPEC_KEY not in by_key:
            raise OptionsError(
                f"compile specs lack '{OPTIONS_SPEC_KEY}'; partitions must come from "
                "TensorRTPartitioner, which sets it"
            )
        options = parse_options(json.loads(bytes(by_key[OPTIONS_SPEC_KEY]).decode()))
        part = bytes(by_key.get(PART_SPEC_KEY, b"")).decode()
        return options, part


# ---- validation ---------------------------------------------------------
FIELDS = {f.name: f for f in dataclasses.fields(CompileOptions)}
# The options the blob carries to the C++ builder, in declaration order (the runtime's table is in it too).
BUILD_OPTIONS: dict[str, BuildOption] = {
    name: field.metadata["build"] for name, field in FIELDS.items() if "build" in field.metadata}


def parse_size(key: str, value: Any) -> int:
    """Bytes from an int or a string such as "2GiB" / "512 MiB"."""
    if isinstance(value, bool):
        raise OptionsError(f"option '{key}': expected bytes (int) or a size like '2GiB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", value)
        if not m:
            raise OptionsError(
                f"option '{key}': cannot read size {value!r}; write bytes or e.g. '512MiB', '2GiB'"
            )
        size = int(m.group(1)) * _SIZE_UNITS[m.group(2) or ""]
    else:
        raise OptionsError(f"option '{key}': expected bytes (int) or a size like '2GiB', got {type(value).__name__}")
    if size <= 0:
        raise OptionsError(f"option '{key}': size must be positive, got {value!r}")
    return size


def _expect(key: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int subclass; never accept True for a number or 1 for a flag.
    if isinstance(value, bool) and kind is not bool:
        raise OptionsError(f"option '{key}': expected {what}, got {value!r}")
    if not isinstance(value, kind):
        raise OptionsError(f"option '{key}': expected {what}, got {type(value).__name__} {value!r}")
    return value


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise OptionsError(f"option '{key}': {value!r} is not one of {', '.join(choices)}")
    return value


def _shape_ranges(key: str, value: Any) -> dict[str, ShapeRange]:
    _expect(key, value, dict, "a table of dimension name -> {min, opt, max}")
    ranges = {}
    for dim, spec in value.items():
        where = f"{key}.{dim}"
        if isinstance(spec, ShapeRange):
            spec = spec.to_json()
        _expect(where, spec, dict, "a table with min, opt and max")
        unknown = set(spec) - {"min", "opt", "max"}
        missing = {"min", "max"} - set(spec)
        if unknown or missing:
            raise OptionsError(
                f"option '{where}': needs keys min and max (opt optional); "
                f"unknown {sorted(unknown)}, missing {sorted(missing)}"
            )
        lo = _expect(f"{where}.min", spec["min"], int, "an integer")
        hi = _expect(f"{where}.max", spec["max"], int, "an integer")
        opt = _expect(f"{where}.opt", spec.get("opt", hi), int, "an integer")
        if not 0 <= lo <= opt <= hi:
            raise OptionsError(f"option '{where}': need 0 <= min <= opt <= max, got {lo}, {opt}, {hi}")
        ranges[str(dim)] = ShapeRange(lo, opt, hi)
    return ranges


def _kernel_archs(key: str, value: Any) -> tuple[str, ...]:
    _expect(key, value, (list, tuple), "a list of architectures")
    if not value:
        raise OptionsError(f"option '{key}': give at least one architecture, from {', '.join(KERNEL_ARCHS)}")
    for arch in value:
        if isinstance(arch, str) and arch not in KERNEL_ARCHS and f"{arch}a" in KERNEL_ARCHS:
            raise OptionsError(f"option '{key}': {arch!r} is not one of {', '.join(KERNEL_ARCHS)}; "
                               f"write {arch}a (the kernel images are arch-specific from sm_90 on)")
        _choice(key, arch, KERNEL_ARCHS)
    return tuple(dict.fromkeys(value))


def _group_size(key: str, value: Any) -> int:
    _expect(key, value, int, f"an integer, one of {', '.join(map(str, INT4_GROUP_SIZES))}")
    if value not in INT4_GROUP_SIZES:
        raise OptionsError(f"option '{key}': INT4 scale groups hold {', '.join(map(str, INT4_GROUP_SIZES))} elements "
                           f"of K, got {value}; smaller groups are more accurate, larger ones fewer bytes")
    return value


def _optional_str(key: str, value: Any) -> str | None:
    return None if value is None else _expect(key, value, str, "a path (string)")


# How a recipe's value is read; a build option without an entry here is checked by its BuildOption only.
_VALIDATORS = {
    "precision": lambda k, v: _choice(k, v, PRECISIONS),
    "truncate_double": lambda k, v: _expect(k, v, bool, "true or false"),
    "shape_ranges": _shape_ranges,
    "workspace_bytes": lambda k, v: None if v is None else parse_size(k, v),
    "timing_cache": _optional_str,
    "kernel_archs": _kernel_archs,
    "grouped_gemm_kernel": lambda k, v: _expect(k, v, bool, "true or false"),
    "fused_experts": lambda k, v: _expect(k, v, bool, "true or false"),
    "expert_precision": lambda k, v: None if v in (None, "precision") else _choice(k, v, EXPERT_PRECISIONS),
    "int4_group_size": lambda k, v: None if v is None else _group_size(k, v),
    "engine_build": lambda k, v: _choice(k, v, ENGINE_BUILD_POLICIES),
    "preflight": lambda k, v: _choice(k, v, PREFLIGHT_POLICIES),
}


def parse_options(values: Mapping[str, Any], base: CompileOptions | None = None, where: str = "") -> CompileOptions:
    """Validated options: `values` over `base` (defaults if None).

    Unknown keys are refused with the valid keys listed; `where` (e.g. the
    recipe part) prefixes messages so users find the offending entry.
    """
    prefix = f"{where}: " if where else ""
    if not isinstance(values, Mapping):
        raise OptionsError(f"{prefix}options must be a table of key = value, got {type(values).__name__}")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise OptionsError(
            f"{prefix}unknown option(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(FIELDS)}"
        )
    parsed = {}
    for key, value in values.items():
        try:
            parsed[key] = _parse_value(key, value)
        except OptionsError as e:
            raise OptionsError(f"{prefix}{e}") from None
    options = dataclasses.replace(base or CompileOptions(), **parsed)
    try:
        _check_expert_precision(options)
    except OptionsError as e:
        raise OptionsError(f"{prefix}{e}") from None
    return options


def _parse_value(key: str, value: Any) -> Any:
    if key in _VALIDATORS:
        value = _VALIDATORS[key](key, value)
    if key in BUILD_OPTIONS and not (value is None and FIELDS[key].default is None):
        value = BUILD_OPTIONS[key].check(key, value)
    return value


def without_fp8(archs) -> list[str]:
    """The architectures of `archs` (kernel_archs names; the "a" suffix optional) that lack FP8 tensor cores."""
    return [arch for arch in archs if arch.removesuffix("a") in NO_FP8_ARCHS]


def int4_group_size(options: CompileOptions) -> int:
    """The INT4 scale groups' size of a part (the default where the recipe leaves it unset)."""
    return options.int4_group_size or DEFAULT_INT4_GROUP_SIZE


def _check_expert_precision(options: CompileOptions) -> None:
    """expert_precision = "fp8" or "int4" needs what quantized experts run on: the grouped-GEMM kernel and a
    bf16/fp16 part (the quantized GEMMs' activation and output dtype); "fp8" also only architectures with FP8
    tensor cores (INT4 runs on every one)."""
    precision = options.expert_precision
    if precision is None:
        return
    unset = (f'or leave expert_precision unset for this part (expert_precision = "precision" where [default] '
             f'sets "{precision}")')
    if not options.grouped_gemm_kernel:
        raise OptionsError(
            f'option \'expert_precision\': "{precision}" needs the grouped-GEMM kernel, but grouped_gemm_kernel = '
            f"false (the dense lowering has no {precision.upper()} form); set grouped_gemm_kernel = true, {unset}")
    if options.precision == "fp32":
        raise OptionsError(
            f'option \'expert_precision\': "{precision}" needs precision "bf16" or "fp16" (the {precision.upper()} '
            f"experts compute in the part's precision; fp32 GroupedMMs are lowered densely); change precision, "
            f"{unset}")
    refused = without_fp8(options.kernel_archs) if precision == "fp8" else []
    if refused:
        kept = [arch for arch in options.kernel_archs if arch not in refused] or ["sm_90a"]
        which = (f"the default kernel_archs ({', '.join(DEFAULT_KERNEL_ARCHS)}) hold"
                 if options.kernel_archs == DEFAULT_KERNEL_ARCHS else "kernel_archs holds")
        raise OptionsError(
            f"option 'expert_precision': \"fp8\", but {which} {', '.join(refused)}, which lack FP8 tensor "
            f"cores (FP8 experts run on {', '.join(FP8_ARCHS)}); drop {', '.join(refused)} from this part's "
            f"kernel_archs (e.g. kernel_archs = {_toml_list(kept)}), use expert_precision = \"int4\" (which runs "
            f"on every architecture), {unset}")


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"
