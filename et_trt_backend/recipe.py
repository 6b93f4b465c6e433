"""Recipes: compile options per part of the user's model.

A recipe is a table (Python dict, TOML or YAML file):

    [default]                  # options for everything no part matches (optional)
    precision = "bf16"

    [parts.velocity]           # a module path in the model ...
    precision = "fp16"

    [parts."decoder.layers.*"] # ... or a glob over module paths
    optimization_level = 5

    [parts.decoder.shape_ranges.tokens]   # a dynamic dimension's TensorRT profile
    min = 1
    opt = 64
    max = 512

Option keys and values are those of et_trt_backend.options (parse_options):
unknown keys are refused with the valid keys listed, wrong types or ranges with
the key named. A part's options are its table over [default] over the
built-in defaults.

Matching. A node belongs to the innermost module that created it (its
`nn_module_stack`), e.g. "decoder.layers.0.moe.experts". A pattern matches a
module path when it matches the path's first segments, segment by segment
(fnmatch globs per segment: "*" never crosses a "."). So "decoder" matches
everything inside the decoder and "decoder.layers.*" every layer. Of the
patterns that match, the most specific wins: more segments, then more literal
segments. Two different patterns that tie are refused as ambiguous, and a
pattern that matches no module of the exported program is refused with the
closest module paths (Recipe.check_parts, called by the partitioner).

Naming dynamic dimensions. A key under shape_ranges names one dynamic
dimension of the exported program, in either of two ways:
- the torch.export.Dim name given at export (Dim("tokens") -> "tokens"), when
  the program still records it (programs exported in this process do;
  torch.export.load()ed ones may not), or
- "input_name:axis", the model's forward argument name and the axis
  ("observations:0"), which always works.
Dimensions a recipe does not name take their range from the exported
program's range_constraints as the user exported them (exported_ranges.py;
min at least 1, opt = max); a dimension without an upper bound must then be
given one, in the recipe or with Dim(max=...).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import sympy
import torch
from torch.export import ExportedProgram

from .exported_ranges import exported_range, finite_bound
from .options import CompileOptions, OptionsError, ShapeRange, parse_options
from .program_inputs import user_input_nodes

logger = logging.getLogger(__name__)

DEFAULT_PART = "default"
_TOP_LEVEL_KEYS = ("default", "parts")


class RecipeError(OptionsError):
    """The recipe cannot be used; the message names the entry and the fix."""


# ---- dynamic dimensions ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DynamicDim:
    """One dynamic dimension (a shape symbol) of an exported program."""

    symbol: str  # e.g. "s16"
    names: tuple[str, ...]  # Dim name first when known, then every "input:axis"
    min: int
    max: int | None  # None: unbounded

    @property
    def name(self) -> str:
        return self.names[0]

    def shape_range(self, given: Mapping[str, ShapeRange]) -> ShapeRange:
        """This dimension's TensorRT profile: the range `given` (shape_ranges) holds under any of its
        names, else the exported program's, min .. max with opt = max. The partitioner (for each
        partition's compile specs) and the lowering (for the ONNX it writes) both resolve it here."""
        rng = next((given[n] for n in self.names if n in given), None)
        if rng is not None:
            return rng
        if self.max is None:
            raise RecipeError(
                f"dynamic dimension {self.name!r} has no upper bound; TensorRT needs one. Give it in the "
                f"recipe ([default.shape_ranges.{self.name}] min/opt/max) or export with "
                f"torch.export.Dim({self.name!r}, max=...)"
            )
        return ShapeRange(self.min, self.max, self.max)


def dynamic_dims(program: ExportedProgram) -> dict[str, DynamicDim]:
    """Dynamic dimensions of the program's user inputs, by symbol name. Their ranges are those the user
    exported (exported_ranges.py) where the program carries them, else its range_constraints."""
    found: dict[str, tuple[list[str], list[str]]] = {}  # symbol -> (Dim names, input:axis names)
    ranges = {str(k): (finite_bound(v.lower), finite_bound(v.upper)) for k, v in program.range_constraints.items()}
    for node in user_input_nodes(program):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for axis, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not isinstance(size.node.expr, sympy.Symbol):
                continue
            symbol = str(size.node.expr)
            ranges[symbol] = exported_range(node, axis) or ranges.get(symbol, (None, None))
            dim_names, axis_names = found.setdefault(symbol, ([], []))
            # The symbol's sources name it as the exported model does (its Dim name, its inputs' axes),
            # also in a partition whose inputs are named otherwise.
            shape_env = size.node.shape_env
            for source in shape_env.var_to_sources.get(size.node.expr, []):
                dim_name = shape_env.source_name_to_debug_name.get(source.name)
                if dim_name and dim_name not in dim_names:
                    dim_names.append(dim_name)
                if hasattr(source, "idx") and hasattr(getattr(source, "base", None), "local_name"):
                    axis_names.append(f"{source.base.local_name}:{source.idx}")
            axis_names.append(f"{node.name}:{axis}")
    dims = {}
    for symbol, (dim_names, axis_names) in found.items():
        lo, hi = ranges.get(symbol, (None, None))
        dims[symbol] = DynamicDim(symbol, tuple(dict.fromkeys(dim_names + axis_names)), max(lo or 1, 1), hi)
    return dims


# ---- the recipe ------------------------------------------------------------
def _specificity(pattern: str) -> tuple[int, int]:
    segments = pattern.split(".")
    literal = sum(1 for s in segments if not any(c in s for c in "*?["))
    return len(segments), literal


def _matches(pattern: str, module_path: str) -> bool:
    want = pattern.split(".")
    have = module_path.split(".") if module_path else []
    return len(have) >= len(want) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want))


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: values must be JSON-serializable (numbers, strings, lists, tables): {e}") from None


class Recipe:
    """Validated per-part compile options."""

    def __init__(self, default: CompileOptions | None = None, parts: Mapping[str, CompileOptions] | None = None):
        self.default = default or CompileOptions()
        self.parts: dict[str, CompileOptions] = dict(parts or {})
        for pattern in self.parts:
            if not pattern or any(not s for s in pattern.split(".")):
                raise RecipeError(f"part {pattern!r}: a part is a module path such as 'decoder.layers.0' or a glob")

    # ---- construction ----
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Recipe":
        if not isinstance(data, Mapping):
            raise RecipeError(f"a recipe is a table with [default] and [parts.<name>], got {type(data).__name__}")
        unknown = sorted(set(data) - set(_TOP_LEVEL_KEYS))
        if unknown:
            raise RecipeError(
                f"unknown recipe section(s) {', '.join(map(repr, unknown))}; a recipe has 'default' and "
                "'parts' (option keys go inside them, e.g. [default] precision = \"bf16\")"
            )
        default_values = data.get("default") or {}
        _check_json(default_values, "[default]")
        default = parse_options(default_values, where="[default]")
        parts_values = data.get("parts") or {}
        if not isinstance(parts_values, Mapping):
            raise RecipeError(f"[parts] must be a table of part name -> options, got {type(parts_values).__name__}")
        parts = {}
        for pattern, values in parts_values.items():
            where = f"[parts.{pattern}]"
            _check_json(values, where)
            try:
                parts[str(pattern)] = parse_options(values, base=default, where=where)
            except OptionsError as e:
                nested = isinstance(values, Mapping) and any(isinstance(v, Mapping) for k, v in values.items()
                                                             if k != "shape_ranges")
                hint = (' (to name a nested module, quote its dotted path: [parts."decoder.layers"])'
                        if nested else "")
                raise RecipeError(f"{e}{hint}") from None
        return cls(default, parts)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Recipe":
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist")
        suffix = path.suffix.lower()
        try:
            if suffix == ".toml":
                import tomllib

                with path.open("rb") as f:
                    data = tomllib.load(f)
            elif suffix in (".yaml", ".yml"):
                import yaml

                with path.open() as f:
                    data = yaml.safe_load(f) or {}
            else:
                raise RecipeError(f"recipe file {path}: use a .toml, .yaml or .yml file")
        except RecipeError:
            raise
        except Exception as e:  # the parsers' own errors carry line and column
            raise RecipeError(f"recipe file {path} cannot be parsed: {e}") from None
        try:
            return cls.from_dict(data)
        except OptionsError as e:
            raise RecipeError(f"recipe file {path}: {e}") from None

    @classmethod
    def coerce(cls, recipe: "Recipe | Mapping[str, Any] | str | os.PathLike | None") -> "Recipe":
        """A Recipe from what users pass to the partitioner: None, a Recipe, a dict or a file path."""
        if recipe is None:
            return cls()
        if isinstance(recipe, Recipe):
            return recipe
        if isinstance(recipe, Mapping):
            return cls.from_dict(recipe)
        if isinstance(recipe, (str, os.PathLike)):
            return cls.from_file(recipe)
        raise RecipeError(f"recipe must be None, a Recipe, a dict or a file path, got {type(recipe).__name__}")

    # ---- lookup ----
    def part_for(self, module_path: str) -> str:
        """The pattern that governs `module_path` (DEFAULT_PART if none matches)."""
        matching = [p for p in self.parts if _matches(p, module_path)]
        if not matching:
            return DEFAULT_PART
        best = max(_specificity(p) for p in matching)
        winners = sorted(p for p in matching if _specificity(p) == best)
        if len(winners) > 1:
            raise RecipeError(
                f"module {module_path!r} matches parts {', '.join(map(repr, winners))} equally; "
                "make one of them more specific"
            )
        return winners[0]

    def options_of(self, part: str) -> CompileOptions:
        return self.parts.get(part, self.default) if part != DEFAULT_PART else self.default

    def check_parts(self, module_paths: Iterable[str]) -> None:
        """Refuse parts that match none of `module_paths` (the modules that created the exported
        program's ops), naming the closest module paths: a misspelled part must not leave its
        modules to [default] unnoticed."""
        paths = {p for p in module_paths if p}
        known = sorted({".".join(p.split(".")[:i]) for p in paths for i in range(1, p.count(".") + 2)})
        unmatched = [pattern for pattern in self.parts if not any(_matches(pattern, path) for path in paths)]
        if not unmatched:
            return
        described = []
        for pattern in unmatched:
            close = difflib.get_close_matches(pattern, known, n=3, cutoff=0.6)
            described.append(f"{pattern!r}" + (f" (closest module paths: {', '.join(map(repr, close))})"
                                               if close else ""))
        top = sorted({p.split(".")[0] for p in paths})
        raise RecipeError(
            f"recipe part{'s' if len(unmatched) > 1 else ''} {', '.join(described)} "
            f"match{'' if len(unmatched) > 1 else 'es'} no module of the exported program; a part is a module path "
            f"or a glob over module paths (top-level modules: {', '.join(top) or 'none'})"
        )

    # ---- shape ranges ----
    def check_shape_ranges(self, program: ExportedProgram) -> dict[str, DynamicDim]:
        """Refuse shape_ranges keys that name no dynamic dimension, or ranges outside the export's."""
        dims = dynamic_dims(program)
        by_name = {name: dim for dim in dims.values() for name in dim.names}
        for part, options in [(DEFAULT_PART, self.default), *self.parts.items()]:
            for key, rng in options.shape_ranges.items():
                where = f"[{'default' if part == DEFAULT_PART else 'parts.' + part}] shape_ranges.{key}"
                dim = by_name.get(key)
                if dim is None:
                    valid = ", ".join(sorted(by_name)) or "none (the program has no dynamic dimensions)"
                    raise RecipeError(f"{where}: no dynamic dimension is named {key!r}; valid names: {valid}")
                if rng.min < dim.min or (dim.max is not None and rng.max > dim.max):
                    upper = "unbounded" if dim.max is None else dim.max
                    raise RecipeError(
                        f"{where}: range {rng.min}..{rng.max} lies outside the exported range "
                        f"{dim.min}..{upper} of {dim.name}; export with a wider torch.export.Dim or narrow the recipe"
                    )
        return dims

    def resolve_shape_ranges(
        self, options: CompileOptions, dims: Mapping[str, DynamicDim], symbols: set[str]
    ) -> CompileOptions:
        """`options` with a range for every dimension in `symbols` (DynamicDim.shape_range), keyed by
        the dimension's name."""
        resolved: dict[str, ShapeRange] = {}
        for symbol in sorted(symbols):
            dim = dims.get(symbol)
            if dim is None:
                continue  # a symbol that no input introduces (e.g. data-dependent); not a profile dimension
            resolved[dim.name] = dim.shape_range(options.shape_ranges)
        return dataclasses.replace(options, shape_ranges=resolved)
