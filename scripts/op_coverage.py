#!/usr/bin/env python3
"""The README's op coverage table: the core-ATen ops et-trt lowers against those Torch-TensorRT converts.

Theirs: the ATen overloads pytorch/TensorRT's dynamo converters register (scripts/torch_tensorrt_converters.txt,
written by scripts/torch_tensorrt_converters.py from their aten_ops_converters.py), a packet standing for all of
its overloads, kept where the overload is core ATen (what a torch.export program decomposed for a backend holds).
Ours: et_trt_backend.op_support.SUPPORTED_TARGETS, an edge program's forms named as ATen names them (view_copy as
view, the dim-order cast and clone as _to_copy and clone). tests/test_op_coverage.py checks the README's table is
this script's; `scripts/op_coverage.py --write` rewrites it there.
"""

from __future__ import annotations

import argparse
import pathlib
import re

import torch

from et_trt_backend import op_support

ROOT = pathlib.Path(__file__).resolve().parents[1]
THEIRS = pathlib.Path(__file__).with_name("torch_tensorrt_converters.txt")
README = ROOT / "README.md"
BEGIN, END = "<!-- op coverage: scripts/op_coverage.py -->", "<!-- end of op coverage -->"

aten = torch.ops.aten
_EDGE_NAMES = {"dim_order_ops::_to_dim_order_copy": "aten::_to_copy", "dim_order_ops::_clone_dim_order": "aten::clone"}


def _name(op: torch._ops.OpOverload) -> str:
    """'aten.<op>.<overload>' of an overload, an edge form named as ATen's (view_copy -> view)."""
    packet = op.name().split(".")[0]
    packet = _EDGE_NAMES.get(packet, packet)
    namespace, base = packet.split("::")
    if base.endswith("_copy") and hasattr(getattr(torch.ops, namespace), base.removesuffix("_copy")):
        base = base.removesuffix("_copy")
    return f"{namespace}.{base}.{op._overloadname}"


def _core_overloads(target: str) -> set[str]:
    """The core-ATen overloads a registration names ('aten.x.y' one, 'aten.x' its packet's)."""
    parts = target.split(".")
    packet = getattr(aten, parts[1], None)
    if packet is None:
        return set()
    names = [parts[2]] if len(parts) > 2 else packet.overloads()
    overloads = [getattr(packet, n) for n in names if n in packet.overloads()]
    return {_name(op) for op in overloads if torch.Tag.core in op.tags}


def theirs() -> set[str]:
    lines = [line.strip() for line in THEIRS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return set().union(*(_core_overloads(target) for target in lines))


def ours() -> set[str]:
    return {_name(op) for op in op_support.SUPPORTED_TARGETS}


def source() -> str:
    return THEIRS.read_text().splitlines()[0].removeprefix("# ").split(":")[0]


def decomposed_by_edge() -> set[str]:
    """Overloads ExecuTorch's to_edge decomposes before a partitioner sees them (unless it preserves them)."""
    from executorch.exir.tracer import _default_decomposition_table

    return {_name(op) for op in _default_decomposition_table() if isinstance(op, torch._ops.OpOverload)}


def table() -> str:
    mine, other = ours(), theirs()
    core_mine = {name for name in mine if torch.Tag.core in _overload(name).tags}
    lacking = other - mine
    decomposed = lacking & decomposed_by_edge()
    commit = source().split()[1][:12]
    return "\n".join([
        BEGIN,
        "| core-ATen overloads | count | which |",
        "|---|---|---|",
        f"| Torch-TensorRT converts (pytorch/TensorRT {commit}) | {len(other)} | |",
        f"| et-trt lowers | {len(core_mine)} | and {len(mine) - len(core_mine)} non-core ones (kept through "
        "`to_edge`, or in programs lowered without it): " + _list(mine - core_mine) + " |",
        f"| both | {len(other & mine)} | |",
        f"| et-trt only | {len(core_mine - other)} | {_list(core_mine - other)} |",
        f"| Torch-TensorRT only, decomposed by ExecuTorch's `to_edge` before a partitioner sees them | "
        f"{len(decomposed)} | {_list(decomposed)} |",
        f"| Torch-TensorRT only | {len(lacking - decomposed)} | {_list(lacking - decomposed)} |",
        END,
    ])


def _overload(name: str) -> torch._ops.OpOverload:
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _list(names) -> str:
    return ", ".join(f"`{n.removeprefix('aten.')}`" for n in sorted(names)) or "none"


def readme_table(text: str) -> str | None:
    match = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), text, re.S)
    return match.group(0) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args()
    text = table()
    if args.write:
        readme = README.read_text()
        current = readme_table(readme)
        if current is None:
            raise SystemExit(f"README.md has no {BEGIN} ... {END} section to replace")
        README.write_text(readme.replace(current, text))
    print(text)


if __name__ == "__main__":
    main()
