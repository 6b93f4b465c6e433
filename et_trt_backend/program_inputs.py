"""The user inputs of an exported program (its placeholders that are not weights or buffers)."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram


def user_input_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """Placeholders of the program's user inputs, in graph order."""
    names = set(program.graph_signature.user_inputs)
    return [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
