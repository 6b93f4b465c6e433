"""Each value is named once and the nodes sort topologically.

TensorRT's ONNX parser finds each node's inputs by name and sorts the nodes
itself. Where two values share a name (a graph input and a node output, say
both "getitem"), a node's input resolves to the wrong producer; the parser
then fails with "Failed to sort the model topologically" / "Graph contains a
cycle" and names no culprit. This rule names both definitions, and the nodes
of any cycle.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from et_trt_backend.preflight.model_view import ModelView, NodeRef
from et_trt_backend.preflight.violation import Violation

RULE = "graph_order"
_FIX = ("a lowering bug: report it with the model. TensorRT's parser would fail with \"Graph contains a cycle\" / "
        "\"Failed to sort the model topologically\"")


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def _reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads: its inputs and what its subgraphs read from outside them."""
    names = {name for name in node.input if name}
    for graph in _subgraphs(node):
        inner = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        inner |= {name for n in graph.node for name in n.output}
        names |= {name for n in graph.node for name in _reads(n)} - inner
        names |= {v.name for v in graph.output} - inner
    return names


def _check_graph(graph: onnx.GraphProto, refs: list[NodeRef], where: str) -> Iterator[Violation]:
    """Violations of one graph; `refs` are its nodes' NodeRefs, in order."""
    inputs = [v.name for v in graph.input]
    definitions: dict[str, str] = {}  # name -> what defines it first
    for name in inputs:
        if name in definitions:
            yield Violation(RULE, where, "graph", f"two graph inputs are named '{name}'; {_FIX}", "")
        definitions[name] = "a graph input"
    for tensor in graph.initializer:
        if definitions.get(tensor.name) not in (None, "a graph input"):  # an input's default value is allowed
            yield Violation(RULE, where, "graph", f"two initializers are named '{tensor.name}'; {_FIX}", "")
        definitions.setdefault(tensor.name, "an initializer")
    producer: dict[str, int] = {}
    for i, ref in enumerate(refs):
        for name in ref.node.output:
            if not name:
                continue
            if name in definitions:
                yield Violation.at(RULE, ref, f"its output '{name}' has the name of {definitions[name]}: a value "
                                   f"name must be unique in its graph; {_FIX}")
            else:
                definitions[name] = f"the output of node {ref.label}"
                producer[name] = i
    # Kahn's algorithm over the producers: whatever is left is on, or behind, a cycle.
    needs = [{producer[name] for name in _reads(ref.node) if name in producer} for ref in refs]
    users: dict[int, list[int]] = {}
    for i, inputs_of in enumerate(needs):
        for j in inputs_of:
            users.setdefault(j, []).append(i)
    waiting = [len(n) for n in needs]
    ready = [i for i, count in enumerate(waiting) if count == 0]
    for i in ready:  # grows while it is read
        for user in users.get(i, []):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    stuck = [i for i, count in enumerate(waiting) if count]
    if stuck:
        names = ", ".join(refs[i].label for i in stuck[:6]) + (f" and {len(stuck) - 6} more" if len(stuck) > 6 else "")
        yield Violation.at(RULE, refs[stuck[0]], f"the nodes do not sort topologically: {names} wait on values "
                           f"that depend on their own outputs (a cycle); {_FIX}")


def check(view: ModelView) -> Iterator[Violation]:
    by_graph: dict[str, list[NodeRef]] = {}
    for ref in view:
        by_graph.setdefault(ref.graph, []).append(ref)
    for path, graph in view.graphs.items():
        yield from _check_graph(graph, by_graph.get(path, []), f"'{path}'")
