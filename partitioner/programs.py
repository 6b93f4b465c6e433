"""Which program of a multi-program export the partitioner is handed, and what its recipe is checked against.

A .pte may hold several programs (methods), lowered together by
to_edge_transform_and_lower({"prefix": ep1, "denoise_step": ep2}, partitioner=[p]).
ExecuTorch 1.5.1 hands each Partitioner hook an ExportedProgram but never its
name, and calls them in this order (exir/program/_program.py and
exir/backend/backend_api.py):
1. for each program, in the dict's order: transform_for_pre_decomposition, then
   ops_to_not_decompose (twice), then its edge program is made;
2. for each program, in the same order: partition();
3. ops_to_not_decompose again on each lowered program, for ExecuTorch's verifier.
So every program passes through transform_for_pre_decomposition before the
first partition(): the partitioner records each program's outline there and
checks the recipe against all of them at the first partition(), before it
tags anything. The name of the program at hand is the loop variable of the
ExecuTorch function iterating over the programs (`_METHOD_LOOPS`); the tests
that export several programs fail if a new ExecuTorch names it otherwise.
"""

from __future__ import annotations

import sys

from torch.export import ExportedProgram

from et_trt_backend.recipe import ProgramOutline, dynamic_dims

from .moe import module_path

# ExecuTorch's name for the program of a single-program export.
SINGLE_PROGRAM = "forward"

# (source file, function, local variable holding the method name) of ExecuTorch's loops over programs.
_METHOD_LOOPS = (
    ("executorch/exir/program/_program.py", "_gen_edge_manager_for_partitioners", "name"),
    ("executorch/exir/backend/backend_api.py", "_", "method_name"),
)


def method_name() -> str | None:
    """The name of the program ExecuTorch is lowering, read from its loop over the programs; None when
    the partitioner is called outside those loops (e.g. directly on one program)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        for source, function, local in _METHOD_LOOPS:
            if code.co_name == function and code.co_filename.endswith(source):
                name = frame.f_locals.get(local)
                if isinstance(name, str):
                    return name
        frame = frame.f_back
    return None


def outline(program: ExportedProgram) -> ProgramOutline:
    """The module paths of the program's ops and its dynamic dimensions."""
    paths = {module_path(n) for n in program.graph.nodes if n.op == "call_function"}
    return ProgramOutline(frozenset(p for p in paths if p), dynamic_dims(program))


class ProgramRegistry:
    """The programs of one to_edge_transform_and_lower call, as transform_for_pre_decomposition saw them,
    and whether the recipe was checked against them."""

    def __init__(self) -> None:
        self._outlines: dict[str, ProgramOutline] = {}
        self._checked = False

    def record(self, name: str, program: ExportedProgram) -> None:
        """Records `program` under `name`; a program seen again, or one after a partition(), starts a
        new export."""
        if self._checked or name in self._outlines:
            self._outlines, self._checked = {}, False
        self._outlines[name] = outline(program)

    def to_check(self, name: str, program: ExportedProgram) -> dict[str, ProgramOutline] | None:
        """The programs the recipe must be checked against before `program` (named `name`) is tagged: all
        the recorded ones at the first partition() of an export, this one alone where it was not
        recorded (the partitioner called outside to_edge_transform_and_lower), else None (checked)."""
        if name not in self._outlines:
            return {name: outline(program)}
        if self._checked:
            return None
        self._checked = True
        return dict(self._outlines)
