"""The compile-option schema: validation errors name the key and the fix."""

import json

import pytest

from et_trt_backend.options import (
    FIELDS,
    KERNEL_ARCHS,
    CompileOptions,
    OptionsError,
    ShapeRange,
    int4_group_size,
    parse_options,
    parse_size,
)


def test_defaults_round_trip_through_compile_specs():
    options = CompileOptions()
    back, part = CompileOptions.from_compile_specs(options.to_compile_specs("decoder"))
    assert back == options
    assert part == "decoder"


def test_every_field_round_trips():
    common = {
        "precision": "fp16",
        "tf32": False,
        "truncate_double": False,
        "shape_ranges": {"tokens": {"min": 1, "opt": 32, "max": 256}},
        "workspace_bytes": "512MiB",
        "optimization_level": 5,
        "timing_cache": "/tmp/cache.bin",
        "engine_build": "never",
        "preflight": "warn",
    }
    # FP8 experts need the grouped-GEMM kernel: the two kernel settings are set apart.
    fp8 = parse_options({**common, "kernel_archs": ["sm_90a", "sm_89"], "expert_precision": "fp8"})
    dense = parse_options({**common, "kernel_archs": ["sm_90a", "sm_87"], "grouped_gemm_kernel": False,
                           "fused_experts": False, "int4_group_size": 64})
    assert fp8.workspace_bytes == 512 << 20
    assert fp8.shape_ranges["tokens"] == ShapeRange(1, 32, 256)
    for options in (fp8, dense):
        back, _ = CompileOptions.from_compile_specs(options.to_compile_specs("velocity"))
        assert back == options
    # Every field is set above to a non-default value, so a new field added
    # without a test here shows up as equal to its default.
    defaults = CompileOptions()
    assert all(getattr(fp8, name) != getattr(defaults, name) or getattr(dense, name) != getattr(defaults, name)
               for name in FIELDS)


def test_compile_spec_payload_is_plain_json():
    payload = dict((s.key, s.value) for s in CompileOptions().to_compile_specs("p"))["et_trt.options"]
    assert json.loads(payload.decode())["precision"] == "bf16"


def test_base_options_are_overridden_not_replaced():
    base = parse_options({"precision": "fp16", "optimization_level": 4})
    merged = parse_options({"optimization_level": 1}, base=base)
    assert (merged.precision, merged.optimization_level) == ("fp16", 1)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"precison": "fp16"}, "unknown option(s) 'precison'; valid keys: precision"),
        ({"precision": "int8"}, "option 'precision': 'int8' is not one of bf16, fp16, fp32"),
        ({"tf32": 1}, "option 'tf32': expected true or false"),
        ({"optimization_level": 7}, "option 'optimization_level': must be an integer 0-5"),
        ({"optimization_level": True}, "option 'optimization_level': expected an integer 0-5"),
        ({"workspace_bytes": "2 GB"}, "option 'workspace_bytes': cannot read size '2 GB'"),
        ({"workspace_bytes": 0}, "option 'workspace_bytes': size must be positive"),
        ({"kernel_archs": ["sm_75"]}, "option 'kernel_archs': 'sm_75' is not one of"),
        ({"kernel_archs": []}, "option 'kernel_archs': give at least one architecture"),
        ({"kernel_archs": ["sm_110"]}, "sm_100a, sm_110a, sm_120a; write sm_110a (the kernel images are arch-specific"),
        ({"engine_build": "sometimes"}, "option 'engine_build': 'sometimes' is not one of auto, always, never"),
        ({"preflight": "ignore"}, "option 'preflight': 'ignore' is not one of error, warn"),
        ({"timing_cache": 3}, "option 'timing_cache': expected a path (string)"),
        ({"shape_ranges": {"tokens": {"min": 8, "max": 4}}}, "option 'shape_ranges.tokens': need 0 <= min <= opt <= max"),
        ({"shape_ranges": {"tokens": {"lo": 1, "max": 4}}}, "option 'shape_ranges.tokens': needs keys min and max"),
        ({"shape_ranges": {"tokens": {"min": 1.5, "max": 4}}}, "option 'shape_ranges.tokens.min': expected an integer"),
        ({"shape_ranges": [1, 2]}, "option 'shape_ranges': expected a table"),
        ({"expert_precision": "int8"}, "option 'expert_precision': 'int8' is not one of fp8, int4, precision"),
        ({"int4_group_size": 256}, "option 'int4_group_size': INT4 scale groups hold 32, 64, 128 elements of K, got "
         "256; smaller groups are more accurate, larger ones fewer bytes"),
        ({"int4_group_size": "128"}, "option 'int4_group_size': expected an integer, one of 32, 64, 128, got str"),
        ({"int4_group_size": True}, "option 'int4_group_size': expected an integer, one of 32, 64, 128, got True"),
        ({"expert_precision": "int4", "grouped_gemm_kernel": False},
         "\"int4\" needs the grouped-GEMM kernel, but grouped_gemm_kernel = false (the dense lowering has no INT4 "
         "form)"),
        ({"expert_precision": "int4", "precision": "fp32"}, "\"int4\" needs precision \"bf16\" or \"fp16\""),
        ({"expert_precision": "fp8", "kernel_archs": ["sm_90a"], "grouped_gemm_kernel": False},
         "\"fp8\" needs the grouped-GEMM kernel, but grouped_gemm_kernel = false"),
        ({"expert_precision": "fp8", "kernel_archs": ["sm_90a"], "precision": "fp32"},
         "\"fp8\" needs precision \"bf16\" or \"fp16\""),
        ({"expert_precision": "fp8", "kernel_archs": ["sm_86", "sm_90a"]},
         "kernel_archs holds sm_86, which lack FP8 tensor cores (FP8 experts run on sm_89, sm_90a, sm_100a, "
         "sm_110a, sm_120a); drop sm_86 from this part's kernel_archs (e.g. kernel_archs = [\"sm_90a\"]), use "
         "expert_precision = \"int4\" (which runs on every architecture), or leave expert_precision unset"),
        ({"expert_precision": "fp8"}, "the default kernel_archs (sm_80, sm_87, sm_90a, sm_100a, sm_110a, sm_120a) "
         "hold sm_80, sm_87, which lack FP8 tensor cores"),
    ],
)
def test_invalid_values_are_refused_with_key_and_fix(values, message):
    with pytest.raises(OptionsError) as err:
        parse_options(values, where="parts.velocity")
    assert str(err.value).startswith("parts.velocity: ")
    assert message in str(err.value)


def test_options_must_be_a_table():
    with pytest.raises(OptionsError, match="options must be a table"):
        parse_options(["precision", "fp16"])


def test_missing_options_spec_is_explained():
    with pytest.raises(OptionsError, match="must come from TensorRTPartitioner"):
        CompileOptions.from_compile_specs([])


@pytest.mark.parametrize("text, size", [("1GiB", 1 << 30), ("64 KiB", 65536), ("100", 100), (4096, 4096)])
def test_sizes(text, size):
    assert parse_size("workspace_bytes", text) == size


def test_expert_precision_precision_means_unset():
    base = parse_options({"expert_precision": "fp8", "kernel_archs": ["sm_90a"]})
    assert base.expert_precision == "fp8"
    assert parse_options({"expert_precision": "precision", "kernel_archs": ["sm_87"]}, base=base).expert_precision \
        is None
    assert CompileOptions().expert_precision is None


def test_int4_experts_run_on_every_architecture_with_a_group_size_per_part():
    everywhere = parse_options({"expert_precision": "int4", "kernel_archs": list(KERNEL_ARCHS)})
    assert everywhere.expert_precision == "int4" and everywhere.int4_group_size is None
    assert int4_group_size(everywhere) == 128  # the default
    part = parse_options({"int4_group_size": 32}, base=everywhere)
    assert (part.expert_precision, int4_group_size(part)) == ("int4", 32)
    assert parse_options({"expert_precision": "precision"}, base=part).expert_precision is None


@pytest.mark.parametrize("arch", KERNEL_ARCHS)
def test_recipes_and_the_kernel_compiler_refuse_fp8_on_the_same_architectures(arch):
    """The FP8 architecture rule is options.py's (without_fp8): a recipe's FP8 experts and an FP8 kernel image
    (kernels/aot.py, checked before anything compiles) are refused on exactly the architectures without FP8
    tensor cores."""
    from et_trt_backend.kernels import aot

    def refused(make) -> bool:
        try:
            make()
        except ValueError as e:
            assert "FP8 tensor cores" in str(e), e
            return True
        return False

    recipe = refused(lambda: parse_options({"expert_precision": "fp8", "kernel_archs": [arch]}))
    kernel = refused(lambda: aot.configs_for(arch, weight_format="fp8"))
    assert recipe == kernel == (arch in ("sm_80", "sm_86", "sm_87")), (recipe, kernel)
