"""A program's weights by placeholder, and the lifted constants a lowering pass adds in their place.

Passes that transform weights once at export (fp8_experts.py quantizes them, moe_fusion.py lays them out
for the fused experts) read a weight's value through its placeholder, add the transformed tensor as a new
lifted constant, and drop the original where nothing reads it any more.
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class ProgramWeights:
    """The program's weights by placeholder, and the lifted constants added to it."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self.graph = program.graph
        self.fake_mode = detect_fake_mode([n.meta.get("val") for n in self.graph.nodes if n.op == "placeholder"])
        self.spec_of = {spec.arg.name: spec for spec in program.graph_signature.input_specs
                        if spec.kind in _WEIGHT_KINDS}

    def weight(self, node) -> tuple[InputSpec, torch.Tensor] | None:
        """(spec, value) when `node` is a weight placeholder of the program."""
        spec = self.spec_of.get(node.name) if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None
        if spec is None:
            return None
        store = self.program.state_dict if spec.target in self.program.state_dict else self.program.constants
        value = store.get(spec.target)
        return (spec, value) if isinstance(value, torch.Tensor) else None

    def add_constant(self, after: torch.fx.Node, name: str, value: torch.Tensor) -> torch.fx.Node:
        """A lifted constant placeholder holding `value`, right after the placeholder `after`."""
        specs = self.program.graph_signature.input_specs
        with self.graph.inserting_after(after):
            node = self.graph.placeholder(name)
        node.meta = {**after.meta, "val": self.fake_mode.from_tensor(value, static_shapes=True)}
        self.program.constants[node.name] = value
        index = next(i for i, spec in enumerate(specs) if spec.arg.name == after.name)
        spec = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), node.name)
        specs.insert(index + 1, spec)
        self.spec_of[node.name] = spec
        return node

    def drop_if_unused(self, node: torch.fx.Node) -> None:
        """Removes the weight placeholder `node` and its value where nothing reads it."""
        spec = self.spec_of.get(node.name)
        if node.users or spec is None:
            return
        signature = self.program.graph_signature
        signature.input_specs.remove(spec)
        self.program.state_dict.pop(spec.target, None)
        self.program.constants.pop(spec.target, None)
        del self.spec_of[node.name]
        self.graph.erase_node(node)
