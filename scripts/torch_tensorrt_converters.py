#!/usr/bin/env python3
"""Writes scripts/torch_tensorrt_converters.txt: the ATen overloads Torch-TensorRT's dynamo converters register.

Reads py/torch_tensorrt/dynamo/conversion/aten_ops_converters.py of a pytorch/TensorRT checkout (its git
directory and a commit, or a work tree) and lists every `torch.ops.aten.<op>[.<overload>]` named in a
`@dynamo_tensorrt_converter(...)` decorator, one a line, after a header naming the commit. The file is the
anchor of the README's op coverage table (scripts/op_coverage.py); nothing here imports Torch-TensorRT.

    scripts/torch_tensorrt_converters.py --git-dir /path/to/TensorRT/.git [--commit REV]
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import subprocess

CONVERTERS = "py/torch_tensorrt/dynamo/conversion/aten_ops_converters.py"
OUTPUT = pathlib.Path(__file__).with_suffix(".txt")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def converter_targets(source: str) -> list[str]:
    """'aten.<op>[.<overload>]' of each converter registration in `source`, sorted, once each."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and _dotted(decorator.func) == "dynamo_tensorrt_converter"):
                continue
            target = _dotted(decorator.args[0]) if decorator.args else None
            if target and target.startswith("torch.ops.aten."):
                found.add(target.removeprefix("torch.ops."))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="pytorch/TensorRT's git directory")
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args()
    git = ["git", "--git-dir", args.git_dir]
    commit = subprocess.run([*git, "rev-parse", args.commit], check=True, capture_output=True, text=True).stdout.strip()
    source = subprocess.run([*git, "show", f"{commit}:{CONVERTERS}"], check=True, capture_output=True,
                            text=True).stdout
    targets = converter_targets(source)
    OUTPUT.write_text(f"# pytorch/TensorRT {commit} {CONVERTERS}: {len(targets)} registrations\n"
                      + "".join(f"{t}\n" for t in targets))
    print(f"{OUTPUT}: {len(targets)} ATen converter registrations of pytorch/TensorRT {commit[:12]}")


if __name__ == "__main__":
    main()
