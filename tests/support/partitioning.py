"""An edge program partitioned by TensorRTPartitioner, with what tests read of the result: the ops in
and outside each partition, each partition's options, and the rules every partitioning must keep."""

from __future__ import annotations

import copy
from collections import Counter

import torch

from et_trt_backend.op_support import aten_overload
from et_trt_backend.options import CompileOptions
from et_trt_partitioner import TensorRTPartitioner
from et_trt_partitioner.moe import find_moe_blocks
from support import moe_models

aten = torch.ops.aten

# Ops of the MoE routing and expert path: none may be left to ExecuTorch.
MOE_OPS = {
    aten._grouped_mm.default,
    aten.topk.default,
    aten.max.dim,
    aten.sort.default,
    aten.argsort.stable,
    aten.histc.default,
    aten.bincount.default,
    aten.cumsum.default,
    aten.index_put.default,
    aten.scatter_add.default,
    aten.scatter.value,
    aten.gather.default,
}


def edge_of(exported):
    """The edge program TensorRTPartitioner receives (its pre-partition steps do not depend on the recipe)."""
    return moe_models.edge_program(exported, TensorRTPartitioner())


class Partitioned:
    """An edge program after partition(), with helpers to read the result."""

    def __init__(self, edge_program, recipe=None):
        self.partitioner = TensorRTPartitioner(recipe)
        self.program = copy.deepcopy(edge_program)  # partition() tags nodes; keep shared fixtures clean
        self.result = self.partitioner.partition(self.program)
        self.calls = [n for n in self.program.graph.nodes if n.op == "call_function"]

    def tag(self, node):
        return node.meta.get("delegation_tag")

    def outside(self) -> Counter:
        """Ops left to ExecuTorch (ignoring getitem and shape arithmetic)."""
        return Counter(
            aten_overload(n.target)
            for n in self.calls
            if self.tag(n) is None and isinstance(aten_overload(n.target), torch._ops.OpOverload)
            and n.target is not aten.sym_size.int
        )

    def ops_in(self, tag) -> Counter:
        return Counter(aten_overload(n.target) for n in self.calls if self.tag(n) == tag)

    def options(self, tag) -> tuple[CompileOptions, str]:
        return CompileOptions.from_compile_specs(self.result.partition_tags[tag].compile_specs)

    def assert_moe_blocks_whole(self, expected_blocks: int) -> None:
        blocks = find_moe_blocks(self.program.graph)
        assert len(blocks) == expected_blocks
        for block in blocks:
            tags = {self.tag(n) for n in block.nodes if n.target is not aten.sym_size.int}
            assert len(tags) == 1 and None not in tags, f"block {block.module!r} split over {tags}"
            assert len(block.grouped_mms) == 2
        left = set(self.outside()) & MOE_OPS
        assert not left, f"MoE ops left outside TensorRT: {left}"

    def assert_sizes_stay_local(self) -> None:
        """No partition returns a SymInt; every SymInt it reads is also a dimension of a tensor it reads."""
        for tag in self.result.partition_tags:
            members = {n for n in self.calls if self.tag(n) == tag}
            for node in members:
                if isinstance(node.meta.get("val"), torch.SymInt):
                    assert all(self.tag(u) == tag for u in node.users), f"{tag} returns size {node.name}"
            inputs = {a for n in members for a in n.all_input_nodes if a not in members}
            carried = {
                s.node.expr
                for a in inputs
                if isinstance(a.meta.get("val"), torch.Tensor)
                for s in a.meta["val"].shape
                if isinstance(s, torch.SymInt)
            }
            for a in inputs:
                if isinstance(a.meta.get("val"), torch.SymInt):
                    assert a.meta["val"].node.expr in carried, f"{tag} reads size {a.name} of no input tensor"

    def assert_weights_tagged(self) -> None:
        signature = self.program.graph_signature
        for node in self.program.graph.nodes:
            if node.op == "placeholder" and node.name in signature.inputs_to_parameters:
                user_tags = {self.tag(u) for u in node.users}
                if None not in user_tags:
                    assert self.tag(node) in user_tags, f"weight {node.name} not tagged into its partition"
