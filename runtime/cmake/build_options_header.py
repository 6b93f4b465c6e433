"""Writes build_options_generated.h, the runtime's table of build options, from et_trt_backend/options.py.

    python build_options_header.py <options.py> <header>

options.py declares each build option once (options.build_option: its name, type, range or choices, default);
the runtime's build (runtime/cmake/build_options.cmake) runs this to make the C++ table the blob reader checks
a blob's entries against (runtime/src/build_options.h), with one typed constant per option that
tensorrt_builder.cc looks the option's value up by. options.py is loaded from its path: it needs only the
standard library, so any Python 3.10 builds the runtime.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

_KINDS = {bool: ("kBool", "BoolOption"), int: ("kInt", "IntOption"), str: ("kChoice", "ChoiceOption")}


def load_options(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location("et_trt_options", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up while making the class
    spec.loader.exec_module(module)
    return module


def header(options) -> str:
    constants, specs, choices = [], [], []
    for index, (name, option) in enumerate(options.BUILD_OPTIONS.items()):
        kind, constant_type = _KINDS[option.kind]
        default = options.FIELDS[name].default
        if option.kind is str:
            array = f"k{''.join(word.title() for word in name.split('_'))}Choices"
            choices.append(f"inline constexpr const char* {array}[] = {{{', '.join(map(json.dumps, option.values))}}};")
            low, high, values = 0, len(option.values) - 1, f"{array}, {len(option.values)}"
            default_value = 0 if default is None else option.values.index(default)
        else:
            low, high = (0, 1) if option.kind is bool else (option.values[0], option.values[-1])
            values, default_value = "nullptr, 0", int(default or 0)
        constants.append(f"inline constexpr {constant_type} {name}{{{index}}};")
        has_default = "true" if default is not None else "false"
        specs.append(f'    {{"{name}", OptionType::{kind}, {has_default}, INT64_C({default_value}), INT64_C({low}), '
                     f"INT64_C({high}), {values}}},")
    return "\n".join([
        "// Generated from et_trt_backend/options.py by runtime/cmake/build_options_header.py: do not edit.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        '#include "build_options.h"',
        "",
        "namespace et_trt::build_option {",
        "",
        *choices,
        "// name, type, has a default, default (a choice's index), range (a choice's indices), choices",
        "inline constexpr OptionSpec kSpecs[] = {",
        *specs,
        "};",
        "",
        *constants,
        "",
        "}  // namespace et_trt::build_option",
        "",
    ])


def main() -> None:
    source, target = map(pathlib.Path, sys.argv[1:])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(header(load_options(source)))


if __name__ == "__main__":
    main()
