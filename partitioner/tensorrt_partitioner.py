"""TensorRTPartitioner: one TensorRT engine per connected supported region of each model part.

Before decompositions, a few meaning-preserving ATen rewrites keep the
program lowerable and its token count dynamic (partitioner/pre_edge_rewrites.py), and
ops_to_not_decompose keeps the non-core ops the lowering needs
(op_support.PRESERVED_OPS). Then, on the edge program:
1. Each node gets its part from the recipe of its program (module path ->
   part name; partitioner/programs.py tells which program it is) and a
   support verdict from et_trt_backend.op_support. At the first program, the
   recipe is checked against every program of the export: a part that
   matches no module of any program it applies to is refused, with the
   closest module paths.
2. MoE blocks are found (partitioner/moe.py). A block whose region holds an
   op TensorRT cannot run, or that the recipe splits across parts, stops the
   export with an error naming the op, its source line and the fix.
3. Per part, torch.fx's CapabilityBasedPartitioner grows maximal connected
   regions of supported nodes (it keeps each region free of cycles through
   outside nodes). Regions never span parts, so each partition has one set of
   options. A region of casts and views alone is no engine. An op reading a
   size that none of its region's tensor inputs carries (an engine recomputes
   sizes from its inputs' shapes) is left to ExecuTorch and the regions regrown.
4. Sizes (SymInts) read by several partitions are left to ExecuTorch, which
   passes them to each: a delegate never returns one; so are sizes another
   tensor input of the partition carries. Checks: every MoE block
   lies in exactly one partition (else the op on the detour is named); no op
   ExecuTorch cannot run (aten._grouped_mm, histc, stable sorts) is left
   outside.
5. Only then are nodes tagged (an error leaves the program untouched).
   Weights are tagged into the partition that uses them; each partition tag
   gets a DelegationSpec with its part's options as compile specs (shape
   ranges resolved for the dynamic dimensions its inputs carry).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Mapping

import sympy
import torch
from executorch.exir import EdgeCompileConfig
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from et_trt_backend import BACKEND_ID
from et_trt_backend import backend as _backend  # noqa: F401  (ExecuTorch finds EtTrtBackend by class name)
from et_trt_backend import op_support
from et_trt_backend.export_report import REASON_META, describe, is_op, left_out
from et_trt_backend.exported_ranges import stamp_exported_ranges
from et_trt_backend.lowering.size_inputs import carrier
from et_trt_backend.op_support import aten_overload, holds_float64
from et_trt_backend.recipe import DEFAULT_PART, Recipe, dynamic_dims
from et_trt_backend.source_lines import source_line

from .errors import PartitionError
from .moe import MoEBlock, find_moe_blocks, module_path
from .pre_edge_rewrites import rewrite_for_edge
from .programs import SINGLE_PROGRAM, ProgramRegistry, method_name

logger = logging.getLogger(__name__)

aten = torch.ops.aten

# Ops with no ExecuTorch portable kernel: left outside a delegate, the program cannot run. (Every preserved
# op is one: core ATen ops have portable kernels.)
MUST_DELEGATE = frozenset(op_support.PRESERVED_OPS) | {aten.sort.stable, aten.bincount.default}


def _op_name(node: Node) -> str:
    return str(aten_overload(node.target))


def _reachable(region: set[Node], step: Callable[[Node], Iterable[Node]]) -> set[Node]:
    """Nodes outside `region` reached from it by repeated `step` (users, or inputs)."""
    seen: set[Node] = set()
    frontier = [m for n in region for m in step(n) if m not in region]
    while frontier:
        node = frontier.pop()
        if node not in seen:
            seen.add(node)
            frontier.extend(step(node))
    return seen


def _detour(region: set[Node]) -> list[Node]:
    """Nodes outside `region` on a path that leaves it and comes back, in graph order."""
    after = _reachable(region, lambda n: n.users)
    before = _reachable(region, lambda n: n.all_input_nodes)
    on_path = (after & before) - region
    return [n for n in next(iter(region)).graph.nodes if n in on_path] if region else []


def _holds_preserved_ops(program: ExportedProgram) -> bool:
    """Whether a graph of `program` (control-flow branches included) calls an op of op_support.PRESERVED_OPS."""
    preserved = set(op_support.PRESERVED_OPS)
    return any(node.op == "call_function" and aten_overload(node.target) in preserved
               for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


_FLOAT64_BOUNDARY = (
    "a float64 tensor would cross the TensorRT partition boundary, and TensorRT binds no float64; the "
    "partition computes float64 in float32 (truncate_double), and the cast to and from float64 stays on "
    "ExecuTorch. Cast this value to float32 in the model to delegate it"
)


def _keep_float64_inside(nodes: list[Node], parts: Mapping[Node, str], reasons: dict[Node, str | None],
                         supported: set[Node], user_inputs: set[str]) -> None:
    """Leaves to ExecuTorch every supported node that would take a float64 tensor from outside a partition or
    hand one out of it, until none does (in place on `reasons` and `supported`).

    Why the casts stay on ExecuTorch rather than in the ONNX: TensorRT has no float64 tensors, so a float64
    engine input or output would need the runtime to convert on the host as well as the engine, and the blob's
    IO specs to differ from the engine's tensors. ExecuTorch's cast kernel does it before the delegate call (as
    Torch-TensorRT's truncate_double casts outside its engines), so the blob and the runtime only ever see
    TensorRT types. rewrite_for_edge puts a cast pair at each float64 program input and output, so that what
    leaves is the outer cast alone.
    """
    def outside(producer: Node, consumer: Node) -> bool:
        if producer.op == "placeholder":
            return producer.name in user_inputs  # weights go into the partition that uses them
        return producer not in supported or parts.get(producer) != parts.get(consumer)

    while True:
        crossing = [
            n for n in nodes if n in supported and (
                any(holds_float64(a) and outside(a, n) for a in n.all_input_nodes)
                or (holds_float64(n) and any(u.op == "output" or outside(n, u) for u in n.users)))
        ]
        if not crossing:
            return
        for node in crossing:
            supported.discard(node)
            reasons[node] = _FLOAT64_BOUNDARY


class _PartSupport(OperatorSupportBase):
    """Supported nodes of one part, for CapabilityBasedPartitioner."""

    def __init__(self, part: str, parts: Mapping[Node, str], supported: set[Node]):
        self.part, self.parts, self.supported = part, parts, supported

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        return node in self.supported and self.parts.get(node) == self.part


class TensorRTPartitioner(Partitioner):
    """Claims MoE blocks whole, with the supported ops around them, one partition per part region.

    recipe: None (defaults), a Recipe, a dict or a path to a TOML/YAML file
    (see et_trt_backend.recipe). One partitioner serves every program of an
    export (partitioner=[TensorRTPartitioner(recipe)]), so that the recipe is
    checked against all of them together.

    preserved_ops_in_config: the caller passes edge_compile_config() to to_edge_transform_and_lower as its
    compile_config (export() does): ExecuTorch then traces each program once where it would trace it three times.
    """

    def __init__(self, recipe: Recipe | Mapping[str, Any] | str | os.PathLike | None = None, *,
                 preserved_ops_in_config: bool = False):
        super().__init__()
        self.recipe = Recipe.coerce(recipe)
        self._programs = ProgramRegistry()
        self._preserved_ops_in_config = preserved_ops_in_config

    @staticmethod
    def edge_compile_config() -> EdgeCompileConfig:
        """ExecuTorch's default edge config, its verifier accepting the preserved ops that are not core ATen (the
        compile_config of a partitioner made with preserved_ops_in_config=True)."""
        return EdgeCompileConfig(_core_aten_ops_exception_list=list(op_support.PRESERVED_OPS))

    # ---- hooks called by to_edge_transform_and_lower ----
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        name = method_name() or SINGLE_PROGRAM
        self._programs.record(name, exported_program)
        recipe = self.recipe.for_program(name)
        truncate_double = all(o.truncate_double for o in (recipe.default, *recipe.parts.values()))
        # The one hook that sees the user's ranges (min 1 included) before ExecuTorch's re-trace narrows them.
        program = rewrite_for_edge(stamp_exported_ranges(exported_program), truncate_double)
        # What runs next is ExecuTorch's own step, silent and long on a large program.
        logger.info("ExecuTorch decomposes the program to its edge dialect; TensorRTPartitioner partitions it then")
        return program

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        # Preserve every occurrence: decomposing them gives ops that are neither
        # core ATen nor lowerable. An unsupported one is reported by partition()
        # with its source line, which beats a verifier error about a decomposed op.
        # The check function makes ExecuTorch keep the ops that its decomposition table lacks (_grouped_mm, histc,
        # bucketize: without it the verifier refuses them as not core ATen), at the price of a third trace of the
        # whole program. Without one ExecuTorch traces it once or twice; that keeps them where the compile config's
        # verifier accepts them (edge_compile_config), or where the program holds none.
        if self._preserved_ops_in_config or not _holds_preserved_ops(ep):
            return list(op_support.PRESERVED_OPS), None
        return list(op_support.PRESERVED_OPS), lambda node: True

    # ---- partitioning ----
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        # Every check runs before the first tag is written: an error leaves the program untouched.
        graph = exported_program.graph
        nodes = [n for n in graph.nodes if n.op == "call_function"]
        name = method_name() or SINGLE_PROGRAM
        logger.info("TensorRTPartitioner: partitioning %d nodes of program %r", len(nodes), name)
        programs = self._programs.to_check(name, exported_program)
        if programs is not None:
            self.recipe.check(programs)
        recipe = self.recipe.for_program(name)
        dims = dynamic_dims(exported_program)
        parts = self._assign_parts(recipe, nodes)
        reasons = {n: op_support.unsupported_reason(n, recipe.options_of(parts[n]).truncate_double) for n in nodes}
        supported = {n for n, r in reasons.items() if r is None}
        _keep_float64_inside(nodes, parts, reasons, supported, set(exported_program.graph_signature.user_inputs))

        blocks = find_moe_blocks(graph)
        for block in blocks:
            self._check_block(block, reasons, parts)

        partitions, tags = self._propose(exported_program, parts, supported, reasons)
        self._check_blocks_whole(blocks, tags, reasons)
        self._check_must_delegate(nodes, tags, reasons)

        specs = {}
        for tag, part, members in partitions:
            options = recipe.resolve_shape_ranges(
                recipe.options_of(part), dims, self._input_symbols(members, tags, tag)
            )
            specs[tag] = DelegationSpec(BACKEND_ID, options.to_compile_specs(part))

        for node, tag in tags.items():
            node.meta["delegation_tag"] = tag
        for node, reason in reasons.items():
            if reason is not None:
                node.meta[REASON_META] = reason  # the report's reason for an op left out (export_report)
        tag_constant_data(exported_program)
        self._log_summary(name, partitions, blocks, tags, nodes)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=specs)

    # ---- steps ----
    @staticmethod
    def _assign_parts(recipe: Recipe, nodes: list[Node]) -> dict[Node, str]:
        """Recipe part of every node; nodes without a module stack follow their producers, else users."""
        parts: dict[Node, str] = {}
        pending = []
        for node in nodes:
            path = module_path(node)
            if path is None:
                pending.append(node)
            else:
                parts[node] = recipe.part_for(path)
        for _ in range(2):  # producers first (topological), then users for what is left
            still = []
            for node in pending:
                near = [parts[n] for n in node.all_input_nodes if n in parts] or [
                    parts[u] for u in node.users if u in parts
                ]
                if near:
                    parts[node] = near[0]
                else:
                    still.append(node)
            pending = still
        for node in pending:
            parts[node] = DEFAULT_PART
        return parts

    def _propose(
        self, program: ExportedProgram, parts: Mapping[Node, str], supported: set[Node], reasons: dict[Node, str | None]
    ) -> tuple[list[tuple[str, str, list[Node]]], dict[Node, str]]:
        """Partitions (tag, part, nodes) of the supported nodes of each part, and each node's tag.

        A partition needs every size it reads on one of its tensor inputs: an engine takes tensors only
        and recomputes sizes from their shapes (lowering/size_inputs.py). A node reading a size that no
        tensor input of its partition carries (a token count whose tensors all stay in ExecuTorch) is left
        to ExecuTorch, and the partitions are proposed again: the tensor that node makes then carries the
        size in. Each round leaves out at least one node, so this ends.
        """
        while True:
            tags: dict[Node, str] = {}
            partitions: list[tuple[str, str, list[Node]]] = []
            for part in sorted(set(parts.values())):
                proposer = CapabilityBasedPartitioner(
                    program.graph_module, _PartSupport(part, parts, supported), allows_single_node_partition=True
                )
                for proposed in proposer.propose_partitions():
                    members = [n for n in proposed.nodes if n.op == "call_function"]
                    if not any(is_op(n) and aten_overload(n.target) not in op_support.DATA_MOVEMENT for n in members):
                        continue  # sizes, casts and views alone: ExecuTorch does them as cheaply as an engine
                    tag = f"tensorrt_{len(partitions)}"
                    partitions.append((tag, part, members))
                    tags.update(dict.fromkeys(members, tag))
            self._release_sizes(partitions, tags)
            stranded = self._readers_of_uncarried_sizes(partitions, tags)
            if not stranded:
                return partitions, tags
            for node, size in stranded.items():
                reasons[node] = f"it reads the size {size}, which no tensor input of its partition carries"
                supported.discard(node)
                logger.info("%s at %s stays in ExecuTorch: %s", _op_name(node), source_line(node), reasons[node])

    def _check_block(self, block: MoEBlock, reasons: Mapping[Node, str | None], parts: Mapping[Node, str]) -> None:
        name = block.module or "<the exported module>"
        for node in (n for n in reasons if n in block.nodes):  # graph order: report the first offender
            reason = reasons.get(node)
            if reason:
                raise PartitionError(
                    f"MoE block {name!r} holds {_op_name(node)}, which the TensorRT lowering cannot run: {reason}.\n"
                    f"  at {source_line(node)}\n"
                    "A MoE block is delegated whole (routing, both grouped GEMMs, activation, combine), so every op "
                    "in it must be supported. Rewrite that line with supported ops (et_trt_backend/op_support lists "
                    "them per op family) or move it out of the MoE module."
                )
        block_parts = sorted({parts[n] for n in block.nodes if n in parts})
        if len(block_parts) > 1:
            raise PartitionError(
                f"the recipe splits MoE block {name!r} across parts {', '.join(block_parts)}; a MoE block runs as "
                f"one engine with one set of options. Name the block itself (or a module above it) in the recipe "
                f"instead of modules inside it."
            )

    @staticmethod
    def _release_sizes(partitions: list[tuple[str, str, list[Node]]], tags: dict[Node, str]) -> None:
        """Sizes (SymInts) computed from tensors outside their partition are left to ExecuTorch when
        another partition or op reads them, or when another tensor input of the partition carries them;
        with them go the sizes in the partition they are computed from.

        A delegate returning a SymInt for another to read ties the two together for nothing (an engine
        returns tensors only); computed by ExecuTorch from a tensor both can see (usually a model input),
        every reader gets it as an argument and recomputes it from a tensor input. Nor should an engine
        take a whole tensor (an image) only to read a size its other inputs carry. Sizes of inner tensors
        stay (moving one out would make the partition leave and re-enter itself).
        """
        for tag, _, members in partitions:
            for node in [n for n in members if isinstance(n.meta.get("val"), torch.SymInt)]:
                if tags.get(node) != tag:
                    continue  # released with a size computed from it
                chain = TensorRTPartitioner._size_chain(node, tag, tags)
                if chain is None:
                    continue  # computed from an inner tensor
                read_outside = any(tags.get(u) != tag for u in node.users)
                if read_outside or TensorRTPartitioner._only_for_a_carried_size(node, members, tags, tag):
                    for n in chain:
                        members.remove(n)
                        del tags[n]

    @staticmethod
    def _only_for_a_carried_size(node: Node, members: list[Node], tags: Mapping[Node, str], tag: str) -> bool:
        """Whether `node` is the partition's one reader of an outside tensor, which it reads for a size that
        another tensor input of the partition carries (releasing it drops that tensor from the inputs)."""
        if node.target is not aten.sym_size.int or tags.get(node.args[0]) == tag:
            return False
        if any(tags.get(u) == tag for u in node.args[0].users if u is not node):
            return False  # the tensor is an input all the same: ExecuTorch would compute the size for nothing
        others = [a for n in members if n is not node for a in n.all_input_nodes if tags.get(a) != tag]
        return carrier(others, node.meta["val"]) is not None

    @staticmethod
    def _size_chain(node: Node, tag: str, tags: Mapping[Node, str]) -> set[Node] | None:
        """`node` and the sizes of partition `tag` it is computed from; None if it reads a tensor of the partition."""
        chain, pending = set(), [node]
        while pending:
            size = pending.pop()
            chain.add(size)
            for arg in size.all_input_nodes:
                if tags.get(arg) != tag or arg in chain:
                    continue
                if not isinstance(arg.meta.get("val"), torch.SymInt):
                    return None
                pending.append(arg)
        return chain

    @staticmethod
    def _readers_of_uncarried_sizes(
        partitions: list[tuple[str, str, list[Node]]], tags: Mapping[Node, str]
    ) -> dict[Node, str]:
        """Nodes whose partition could not compute a size they read, with that size: an integer (SymInt) input
        that no tensor input has as a dimension, or a tensor input whose shape holds a symbol that no tensor
        input has as a dimension of its own (a token count padded to a multiple of 16 in ExecuTorch, s + (16 - s
        % 16) % 16, where no input has s: its profile could not be written)."""
        stranded: dict[Node, str] = {}
        for tag, _, members in partitions:
            inputs = list(dict.fromkeys(a for n in members for a in n.all_input_nodes if tags.get(a) != tag))
            tensors = [a.meta["val"] for a in inputs if isinstance(a.meta.get("val"), torch.Tensor)]
            own = {d.node.expr for t in tensors for d in t.shape if isinstance(d, torch.SymInt)
                   and isinstance(d.node.expr, sympy.Symbol)}
            for node in inputs:
                value = node.meta.get("val")
                if isinstance(value, torch.SymInt):
                    uncarried = [value] if carrier(inputs, value) is None else []
                elif isinstance(value, torch.Tensor):
                    uncarried = [d for d in value.shape if isinstance(d, torch.SymInt)
                                 and not d.node.expr.free_symbols <= own]
                else:
                    uncarried = []
                if uncarried:
                    stranded.update((u, str(uncarried[0])) for u in node.users if tags.get(u) == tag)
        return stranded

    @staticmethod
    def _check_blocks_whole(
        blocks: list[MoEBlock], tags: Mapping[Node, str], reasons: Mapping[Node, str | None]
    ) -> None:
        for block in blocks:
            block_tags = {tags.get(n) for n in block.nodes if is_op(n)}
            if len(block_tags) == 1 and None not in block_tags:
                continue
            detour = _detour(block.nodes)
            culprit = next((n for n in detour if reasons.get(n)), detour[0] if detour else None)
            where = ""
            if culprit is not None:
                why = reasons.get(culprit) or f"it belongs to another part ({module_path(culprit)!r})"
                where = f" through {_op_name(culprit)} at {source_line(culprit)} ({why})"
            raise PartitionError(
                f"MoE block {block.module or '<the exported module>'!r} would be split across delegates: a path "
                f"leaves the block{where} and comes back. Keep the block's computation inside its module with "
                "supported ops."
            )

    @staticmethod
    def _check_must_delegate(nodes: list[Node], tags: Mapping[Node, str], reasons: Mapping[Node, str | None]) -> None:
        for node in nodes:
            if aten_overload(node.target) in MUST_DELEGATE and node not in tags:
                reason = reasons.get(node) or "it lies in a part of the graph no partition could take"
                raise PartitionError(
                    f"{_op_name(node)} at {source_line(node)} would be left outside TensorRT, and ExecuTorch has no "
                    f"kernel for it; the program could not run. Why it was not delegated: {reason}."
                )

    @staticmethod
    def _input_symbols(members: list[Node], tags: Mapping[Node, str], tag: str) -> set[str]:
        """Shape symbols of the tensors (and sizes) flowing into a partition."""
        symbols: set[str] = set()
        for node in members:
            for arg in node.all_input_nodes:
                if tags.get(arg) == tag:
                    continue
                val = arg.meta.get("val")
                for v in val if isinstance(val, (list, tuple)) else [val]:
                    sizes = v.shape if isinstance(v, torch.Tensor) else [v]
                    for size in sizes:
                        if isinstance(size, torch.SymInt):
                            symbols.update(str(s) for s in size.node.expr.free_symbols)
        return symbols

    @staticmethod
    def _log_summary(name, partitions, blocks, tags, nodes) -> None:
        logger.info("TensorRTPartitioner: program %r: %d partition(s), %d MoE block(s)", name, len(partitions),
                    len(blocks))
        for tag, part, members in partitions:
            moe = [b.module or "<root>" for b in blocks if tags.get(b.grouped_mms[0]) == tag]
            logger.info(
                "  %s: part %r, %d ops%s", tag, part, sum(map(is_op, members)),
                f", MoE blocks {moe}" if moe else "",
            )
        outside = left_out([n for n in nodes if n not in tags])
        if outside:
            # At WARNING: Python shows it with no logging configured (export_report.report(edge) has the same).
            logger.warning("TensorRTPartitioner: %s", describe(outside))
