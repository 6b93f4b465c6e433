"""Recipes: parsing (dict, TOML, YAML), part matching, validation errors and shape ranges."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from et_trt_backend.lowering import lower_to_onnx
from et_trt_backend.options import CompileOptions, OptionsError, ShapeRange
from et_trt_backend.recipe import DEFAULT_PART, Recipe, RecipeError, dynamic_dims
from et_trt_partitioner import TensorRTPartitioner
from et_trt_partitioner.programs import outline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import moe_policy  # noqa: E402

EXAMPLE = {
    "default": {
        "precision": "bf16",
        "engine_build": "auto",
        "shape_ranges": {"tokens": {"min": 2, "opt": 64, "max": 512}},
    },
    "parts": {
        "velocity": {"precision": "fp16", "optimization_level": 5, "workspace_bytes": "1GiB"},
        "decoder": {
            "precision": "bf16",
            "optimization_level": 3,
            "workspace_bytes": "2GiB",
            "kernel_archs": ["sm_87", "sm_90a", "sm_110a"],
        },
    },
}


# ---- parsing ------------------------------------------------------------------
def test_example_toml_equals_dict():
    from_file = Recipe.from_file(ROOT / "examples" / "recipe.toml")
    from_dict = Recipe.from_dict(EXAMPLE)
    assert from_file.default == from_dict.default
    assert from_file.parts == from_dict.parts
    assert from_file.parts["velocity"].workspace_bytes == 1 << 30
    assert from_file.parts["decoder"].shape_ranges == {"tokens": ShapeRange(2, 64, 512)}  # from [default]
    assert from_file.parts["velocity"].shape_ranges == from_file.default.shape_ranges


def test_yaml_equals_dict(tmp_path):
    import yaml

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(EXAMPLE))
    assert Recipe.from_file(path).parts == Recipe.from_dict(EXAMPLE).parts


def test_parts_inherit_default():
    recipe = Recipe.from_dict({"default": {"precision": "fp16", "optimization_level": 1}, "parts": {"a": {"tf32": False}}})
    assert recipe.parts["a"] == CompileOptions(precision="fp16", optimization_level=1, tf32=False)
    assert recipe.default == CompileOptions(precision="fp16", optimization_level=1)


def test_empty_and_none_recipes_are_defaults():
    assert Recipe.coerce(None).default == CompileOptions()
    assert Recipe.from_dict({}).parts == {}
    recipe = Recipe.from_dict(EXAMPLE)
    assert Recipe.coerce(recipe) is recipe


# ---- matching -------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, part",
    [
        ("decoder.layers.1.moe.experts", "decoder.layers.1"),  # literal beats glob
        ("decoder.layers.0.moe", "decoder.layers.*"),  # glob beats shorter prefix
        ("decoder.embed", "decoder"),
        ("decoder", "decoder"),
        ("decoderx", DEFAULT_PART),  # whole segments only
        ("velocity.block", DEFAULT_PART),
        ("", DEFAULT_PART),
    ],
)
def test_most_specific_part_wins(path, part):
    recipe = Recipe.from_dict(
        {"parts": {"decoder": {}, "decoder.layers.*": {"precision": "fp16"}, "decoder.layers.1": {"precision": "fp32"}}}
    )
    assert recipe.part_for(path) == part


def test_glob_star_does_not_cross_dots():
    recipe = Recipe.from_dict({"parts": {"*.moe": {"precision": "fp16"}}})
    assert recipe.part_for("block.moe.router") == "*.moe"
    assert recipe.part_for("a.block.moe") == DEFAULT_PART


def test_ambiguous_parts_are_refused():
    recipe = Recipe.from_dict({"parts": {"decoder.*": {}, "*.layers": {}}})
    with pytest.raises(RecipeError, match=r"matches parts '\*.layers', 'decoder.\*' equally"):
        recipe.part_for("decoder.layers.0")


# ---- errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, message",
    [
        ({"defaults": {}}, "unknown recipe section(s) 'defaults'; a recipe has 'default', 'parts' and 'programs'"),
        ({"parts": {"velocity": {"precison": "fp16"}}}, "[parts.velocity]: unknown option(s) 'precison'; valid keys: precision, tf32"),
        ({"default": {"precision": "int8"}}, "[default]: option 'precision': 'int8' is not one of bf16, fp16, fp32"),
        ({"default": {"optimization_level": 9}}, "option 'optimization_level': must be an integer 0-5"),
        ({"default": {"optimization_level": "3"}}, "option 'optimization_level': expected an integer 0-5, got str"),
        ({"default": {"tf32": 1}}, "option 'tf32': expected true or false"),
        ({"default": {"workspace_bytes": "lots"}}, "option 'workspace_bytes': cannot read size 'lots'"),
        ({"default": {"workspace_bytes": -5}}, "option 'workspace_bytes': size must be positive"),
        ({"default": {"kernel_archs": ["sm_75"]}}, "option 'kernel_archs': 'sm_75' is not one of"),
        ({"default": {"kernel_archs": []}}, "option 'kernel_archs': give at least one architecture"),
        ({"default": {"engine_build": "sometimes"}}, "option 'engine_build': 'sometimes' is not one of auto, always, never"),
        ({"default": {"timing_cache": 3}}, "option 'timing_cache': expected a path (string)"),
        ({"default": {"shape_ranges": {"tokens": {"min": 8, "max": 4}}}}, "option 'shape_ranges.tokens': need 0 <= min <= opt <= max"),
        ({"default": {"shape_ranges": {"tokens": {"min": 1}}}}, "option 'shape_ranges.tokens': needs keys min and max"),
        ({"default": {"timing_cache": object()}}, "[default]: values must be JSON-serializable"),
        ({"default": {"preflight": "ignore"}}, "option 'preflight': 'ignore' is not one of error, warn"),
        ({"default": {"kernel_archs": "sm_90a"}}, "option 'kernel_archs': expected a list of architectures"),
        ({"default": {"shape_ranges": [2, 8]}}, "option 'shape_ranges': expected a table of dimension name"),
        ({"default": {"shape_ranges": {"tokens": {"min": True, "max": 8}}}}, "option 'shape_ranges.tokens.min': expected an integer"),
        ({"default": "bf16"}, "[default]: options must be a table of key = value, got str"),
        ({"parts": {"a": {"kernel_archs": {"sm_90a"}}}}, "[parts.a]: values must be JSON-serializable"),
        ({"parts": ["velocity"]}, "[parts] must be a table of part name -> options"),
        ({"parts": {"a..b": {}}}, "part 'a..b': a part is a module path"),
        ({"parts": {"decoder": {"layers": {"precision": "fp16"}}}}, 'quote its dotted path: [parts."decoder.layers"]'),
        (["not", "a", "table"], "a recipe is a table with [default] and [parts.<name>], got list"),
        ({"parts": {"decoder": {"expert_precision": "fp8"}}},
         "[parts.decoder]: option 'expert_precision': \"fp8\", but the default kernel_archs (sm_80, sm_87, "),
        ({"default": {"expert_precision": "fp8", "kernel_archs": ["sm_90a"]}, "parts": {"velocity": {
            "kernel_archs": ["sm_87"]}}}, "[parts.velocity]: option 'expert_precision': \"fp8\", but kernel_archs "
         "holds sm_87"),
    ],
)
def test_recipe_errors_name_the_problem(data, message):
    with pytest.raises(OptionsError) as error:
        Recipe.from_dict(data)
    assert message in str(error.value)


def test_expert_precision_per_part():
    recipe = Recipe.from_dict({"default": {"expert_precision": "fp8", "kernel_archs": ["sm_90a"]},
                               "parts": {"velocity": {"expert_precision": "precision", "kernel_archs": ["sm_87"]}}})
    assert recipe.options_of("decoder").expert_precision == "fp8"
    assert recipe.options_of("velocity").expert_precision is None


def test_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        Recipe.from_file(tmp_path / "nope.toml")


def test_unknown_file_type(tmp_path):
    path = tmp_path / "recipe.json"
    path.write_text("{}")
    with pytest.raises(RecipeError, match=r"use a \.toml, \.yaml or \.yml file"):
        Recipe.from_file(path)


def test_toml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text('[default]\nprecision = "bf16\n')
    with pytest.raises(RecipeError, match=r"recipe.toml cannot be parsed: .*line 2"):
        Recipe.from_file(path)


def test_yaml_syntax_error_names_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("default: [precision: bf16\n")
    with pytest.raises(RecipeError, match=r"recipe.yaml cannot be parsed"):
        Recipe.from_file(path)


def test_file_option_error_names_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("parts:\n  velocity:\n    precision: int4\n")
    with pytest.raises(RecipeError, match=r"recipe.yaml: \[parts.velocity\]: option 'precision'"):
        Recipe.from_file(path)


def test_wrong_recipe_type():
    with pytest.raises(RecipeError, match="recipe must be None, a Recipe, a dict or a file path, got int"):
        Recipe.coerce(42)


def test_partitioner_refuses_a_bad_recipe_before_export(tmp_path):
    # The error comes at construction, before anything is lowered or written.
    with pytest.raises(OptionsError, match="unknown option"):
        TensorRTPartitioner({"default": {"precisoin": "fp16"}})


# ---- shape ranges ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def program():
    return moe_policy.export_policy()


def test_dynamic_dims_know_dim_name_and_input_axis(program):
    (dim,) = dynamic_dims(program).values()
    assert dim.names == ("tokens", "observations:0")
    assert (dim.min, dim.max) == (2, 512)


@pytest.mark.parametrize("part, message", [
    ("decodr", "recipe part 'decodr' (closest module paths: 'decoder'"),
    ("decoder.layer.*", "recipe part 'decoder.layer.*' (closest module paths: 'decoder.layers."),
    ("*.attention", "recipe part '*.attention' matches no module"),
])
def test_a_part_matching_no_module_is_refused_before_anything_is_tagged(program, part, message):
    recipe = {"parts": {"velocity": {"precision": "fp16"}, part: {"precision": "fp32"}}}
    with pytest.raises(RecipeError) as error:
        TensorRTPartitioner(recipe).partition(program)
    assert message in str(error.value)
    assert "matches no module of the exported program" in str(error.value)
    assert "(top-level modules: decoder, velocity)" in str(error.value) and "\n" not in str(error.value)
    assert not any("delegation_tag" in n.meta for n in program.graph.nodes)


def test_every_matching_part_and_glob_is_accepted(program):
    recipe = Recipe.from_dict({"parts": {p: {} for p in ("decoder", "decoder.layers.*", "*.block.moe", "velocity.time_mlp.0")}})
    recipe.check({"forward": outline(program)})


class _Twice(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _twice(dim: torch.export.Dim) -> torch.export.ExportedProgram:
    return torch.export.export(_Twice(), (torch.randn(4, 3),), dynamic_shapes=({0: dim},))


def test_unbounded_dims_need_a_range():
    exported = _twice(torch.export.Dim("n"))
    dims = dynamic_dims(exported)
    (symbol,) = dims
    assert dims[symbol].max is None
    unbounded = r"'n' has no upper bound.*torch.export.Dim\('n', max=\.\.\.\)"
    with pytest.raises(RecipeError, match=unbounded):
        Recipe().resolve_shape_ranges(CompileOptions(), dims, {symbol})
    with pytest.raises(RecipeError, match=unbounded):  # the lowering refuses it alike
        lower_to_onnx(exported, CompileOptions())
    given = Recipe.from_dict({"default": {"shape_ranges": {"x:0": {"min": 1, "opt": 8, "max": 64}}}})
    resolved = given.resolve_shape_ranges(given.default, dims, {symbol})
    assert resolved.shape_ranges == {"n": ShapeRange(1, 8, 64)}  # keyed by the Dim name


@pytest.mark.parametrize("dim, shape_ranges", [
    (torch.export.Dim("n", min=2, max=64), {}),
    (torch.export.Dim("n", min=2, max=64), {"x:0": {"min": 4, "opt": 8, "max": 32}}),
    (torch.export.Dim("n"), {"n": {"min": 1, "opt": 16, "max": 128}}),
], ids=["from-the-export", "by-input-axis", "by-dim-name"])
def test_the_lowering_writes_the_ranges_the_partitioner_resolves(dim, shape_ranges):
    exported = _twice(dim)
    recipe = Recipe.from_dict({"default": {"shape_ranges": shape_ranges}})
    recipe.check({"forward": outline(exported)})
    dims = dynamic_dims(exported)
    resolved = recipe.resolve_shape_ranges(recipe.default, dims, set(dims)).shape_ranges
    rows = lower_to_onnx(exported, recipe.default).inputs[0].dims[0]
    assert {rows.name: ShapeRange(rows.min, rows.opt, rows.max)} == resolved


@pytest.mark.parametrize("name", ["tokens", "observations:0"])
def test_either_name_selects_the_dim(program, name):
    recipe = Recipe.from_dict({"default": {"shape_ranges": {name: {"min": 4, "opt": 32, "max": 256}}}})
    recipe.check({"forward": outline(program)})
    dims = dynamic_dims(program)
    resolved = recipe.resolve_shape_ranges(recipe.default, dims, set(dims))
    assert resolved.shape_ranges == {"tokens": ShapeRange(4, 32, 256)}


def test_defaults_come_from_range_constraints(program):
    recipe = Recipe()
    recipe.check({"forward": outline(program)})
    dims = dynamic_dims(program)
    assert recipe.resolve_shape_ranges(recipe.default, dims, set(dims)).shape_ranges == {
        "tokens": ShapeRange(2, 512, 512)
    }
    assert recipe.resolve_shape_ranges(recipe.default, dims, set()).shape_ranges == {}


def test_unknown_dim_name_lists_valid_names(program):
    recipe = Recipe.from_dict({"parts": {"decoder": {"shape_ranges": {"token": {"min": 2, "max": 8}}}}})
    with pytest.raises(RecipeError, match=r"\[parts.decoder\] shape_ranges.token: no dynamic dimension is named 'token'; "
                       r"valid names: observations:0, tokens"):
        recipe.check({"forward": outline(program)})


def test_range_outside_the_export_is_refused(program):
    recipe = Recipe.from_dict({"default": {"shape_ranges": {"tokens": {"min": 1, "max": 4096}}}})
    with pytest.raises(RecipeError, match=r"range 1..4096 lies outside the exported range 2..512 of tokens"):
        recipe.check({"forward": outline(program)})


def test_toml_dotted_and_glob_part_names(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(
        '[parts."decoder.layers.*"]\nprecision = "fp16"\n\n'
        '[parts."decoder.layers.1".shape_ranges.tokens]\nmin = 2\nmax = 64\n'
    )
    recipe = Recipe.from_file(path)
    assert recipe.part_for("decoder.layers.0.moe") == "decoder.layers.*"
    assert recipe.options_of("decoder.layers.*") == CompileOptions(precision="fp16")
    assert recipe.options_of(recipe.part_for("decoder.layers.1")).shape_ranges == {"tokens": ShapeRange(2, 64, 64)}


# ---- several programs ---------------------------------------------------------------------
def _outline(paths, **dims):
    """A program's outline: its module paths, and dims by name -> (min, max)."""
    from et_trt_backend.recipe import DynamicDim, ProgramOutline

    return ProgramOutline(frozenset(paths), {f"s{i}": DynamicDim(f"s{i}", (name, f"x:{i}"), lo, hi)
                                             for i, (name, (lo, hi)) in enumerate(dims.items())})


POLICY = {  # a VLA's two programs: the prefix (vision + decoder) and a denoising step (decoder + head)
    "prefix": _outline({"vision.patch", "decoder.layers.0"}, tokens=(1, 256)),
    "denoise_step": _outline({"decoder.layers.0", "head.time_mlp"}, prefix_len=(1, 256)),
}
PROGRAMS = {
    "default": {"precision": "bf16", "optimization_level": 2},
    "parts": {"vision": {"precision": "fp16"}, "decoder": {"workspace_bytes": "1GiB"}},
    "programs": {
        "denoise_step": {
            "default": {"precision": "fp32", "shape_ranges": {"prefix_len": {"min": 1, "opt": 64, "max": 256}}},
            "parts": {"decoder": {"optimization_level": 5}, "head": {"tf32": False}},
        },
    },
}


def test_a_program_table_layers_over_the_top_level():
    recipe = Recipe.from_dict(PROGRAMS)
    step, prefix = recipe.for_program("denoise_step"), recipe.for_program("prefix")
    assert prefix is recipe  # no table of its own: the top level alone
    assert step.default == CompileOptions(precision="fp32", optimization_level=2,
                                          shape_ranges={"prefix_len": ShapeRange(1, 64, 256)})
    # [parts.decoder], then [programs.denoise_step.parts.decoder], over the program's default
    assert step.options_of(step.part_for("decoder.layers.0")) == CompileOptions(
        precision="fp32", optimization_level=5, workspace_bytes=1 << 30,
        shape_ranges={"prefix_len": ShapeRange(1, 64, 256)})
    assert prefix.options_of(prefix.part_for("decoder.layers.0")) == CompileOptions(
        precision="bf16", optimization_level=2, workspace_bytes=1 << 30)
    assert step.options_of(step.part_for("head.time_mlp")).tf32 is False
    assert prefix.part_for("head.time_mlp") == DEFAULT_PART  # a program's part is that program's only
    assert step.options_of(step.part_for("vision")).precision == "fp16"  # a top-level part, in every program
    recipe.check(POLICY)  # vision and prefix_len exist in one program only: fine


def test_the_program_table_in_toml(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text('[default]\nprecision = "bf16"\n\n[programs.denoise_step.default]\nprecision = "fp16"\n\n'
                    '[programs.denoise_step.parts.head]\noptimization_level = 5\n')
    step = Recipe.from_file(path).for_program("denoise_step")
    assert step.options_of(step.part_for("head")) == CompileOptions(precision="fp16", optimization_level=5)


@pytest.mark.parametrize("change, message", [
    ({"programs": {"denoise": {}}}, "recipe table(s) [programs.denoise] name no program of the export; its "
     "programs: 'prefix', 'denoise_step'"),
    ({"parts": {"visoin": {}}}, "recipe part 'visoin' (closest module paths: 'vision') matches no module of the "
     "exported programs 'prefix', 'denoise_step'"),
    ({"programs": {"denoise_step": {"parts": {"vision": {}}}}}, "recipe part 'vision' of program 'denoise_step' "
     "matches no module of the exported programs 'denoise_step'; a part is a module path or a glob over module "
     "paths (top-level modules: decoder, head)"),
    ({"default": {"shape_ranges": {"token": {"min": 1, "max": 8}}}}, "[default] shape_ranges.token: no dynamic "
     "dimension is named 'token'; valid names: prefix_len, tokens, x:0"),
    ({"programs": {"prefix": {"default": {"shape_ranges": {"prefix_len": {"min": 1, "max": 8}}}}}},
     "[programs.prefix.default] shape_ranges.prefix_len: no dynamic dimension is named 'prefix_len'; valid "
     "names: tokens, x:0"),
    ({"parts": {"decoder": {"shape_ranges": {"tokens": {"min": 1, "max": 512}}}}}, "[parts.decoder] "
     "shape_ranges.tokens: range 1..512 lies outside the exported range 1..256 of tokens"),
    ({"programs": {"prefix": {"default": {"precision": "fp64"}}}}, "[programs.prefix.default]: option "
     "'precision': 'fp64' is not one of"),
    ({"programs": {"prefix": {"parts": {"decoder": {"optimization_level": 7}}}}}, "[programs.prefix.parts.decoder]: "
     "option 'optimization_level'"),
    ({"programs": {"prefix": {"precision": "fp16"}}}, "[programs.prefix]: unknown key(s) 'precision'; a "
     "program's table has 'default' and 'parts'"),
    ({"programs": ["prefix"]}, "[programs] must be a table of program name -> recipe"),
])
def test_program_errors_name_the_table(change, message):
    with pytest.raises(OptionsError) as error:
        Recipe.from_dict({**PROGRAMS, **change}).check(POLICY)
    assert message in str(error.value)
