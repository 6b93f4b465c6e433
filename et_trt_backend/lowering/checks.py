"""Data checks (op_support/checks.py) -> extra engine outputs the runtime checks.

Each aten._assert_async.msg(condition, message) of the partition leaves the
graph; its condition, as a bool scalar, becomes an output after the
partition's own, which the blob lists as a Check with the message
(serialization.blob.CheckSpec). The C++ runtime binds those outputs to its own
buffers and fails the delegate call with the message where one is false.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument
from torch.utils import _pytree as pytree

aten = torch.ops.aten

# The ops this module turns into outputs (onnx_export.has_translation counts them).
TARGETS = frozenset({aten._assert_async.msg})


def checks_to_outputs(program: torch.export.ExportedProgram) -> list[str]:
    """Moves the program's checks to outputs appended after its own; returns their messages, in order."""
    graph = program.graph
    output = graph.output_node()
    (values,) = output.args
    messages, conditions = [], []
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in TARGETS]:
        condition, message = node.args
        if condition.meta["val"].dtype != torch.bool:
            with graph.inserting_before(output):
                condition = graph.call_function(aten.ne.Scalar, (condition, 0))
            condition.meta["val"] = node.args[0].meta["val"] != 0
        conditions.append(condition)
        messages.append(message)
        graph.erase_node(node)
    if conditions:
        output.args = ((*values, *conditions),)
        program.graph_signature.output_specs.extend(
            OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(c.name), None) for c in conditions)
        # the call's output structure: the ONNX exporter unflattens the outputs by it (flat either way)
        signature = program.module_call_graph[0].signature
        signature.out_spec = pytree.tree_structure(tuple(range(len(values) + len(conditions))))
        program.graph_module.recompile()
    return messages
