"""Complex tensors as real pairs, rewritten in the ATen program before ExecuTorch's edge decompositions.

Rotary embeddings written with complex numbers (DeepSeek-V2: torch.polar, view_as_complex, a complex
product, view_as_real) cannot reach TensorRT, which has no complex type, nor ExecuTorch's to_edge, which
refuses polar (not core ATen) and complex views. The same arithmetic on real pairs is exact: a complex
tensor of shape S becomes a real tensor of shape S + [2] (real, imaginary parts, the layout view_as_real
gives), so view_as_complex and view_as_real become the pair itself, (a + bi)(c + di) = (ac - bd) + (ad + bc)i
and polar(r, t) = (r cos t, r sin t). Shape ops move to the pair's dimensions (a negative dimension counts
one more from the end). A complex op without a form here stops the export naming the op and its source line
(ExecuTorch could not export it either).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, Node

from et_trt_backend.source_lines import source_line

from .errors import PartitionError

logger = logging.getLogger(__name__)

aten = torch.ops.aten
_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def _is_complex(value) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, torch.Tensor) and v.dtype.is_complex for v in values)


def _touches_complex(node: Node) -> bool:
    return _is_complex(node.meta.get("val")) or any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes)


def _pair_dim(dim: int) -> int:
    """A dimension of a complex tensor as the same dimension of its pair (the pair's last one is extra)."""
    return dim if dim >= 0 else dim - 1


class _Pairs:
    """Builds the real-pair form of each complex node in graph order; `pair[node]` is the form of a complex node."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pair: dict[Node, Node] = {}
        self.node: Node | None = None  # the node being rewritten: new nodes take its module and source line

    def op(self, target, *args, **kwargs) -> Node:
        new = self.graph.call_function(target, args, kwargs)
        new.meta.update({k: self.node.meta[k] for k in ("nn_module_stack", "stack_trace") if k in self.node.meta})
        return new

    def parts(self, node: Node) -> tuple[Node, Node]:
        pair = self.pair[node]
        return self.op(aten.select.int, pair, -1, 0), self.op(aten.select.int, pair, -1, 1)

    def stack(self, real: Node, imaginary: Node) -> Node:
        return self.op(aten.stack.default, [real, imaginary], -1)

    def unsupported(self, why: str) -> PartitionError:
        node = self.node
        return PartitionError(
            f"{node.target} on complex tensors at {source_line(node)}: {why}. et-trt computes complex numbers as "
            "real pairs (partitioner/complex_pairs.py lists the ops it rewrites); write this step with those "
            "ops, or on the real and imaginary parts (torch.view_as_real)")


def _mul(p: _Pairs, node: Node) -> Node:
    a, b = node.args[:2]
    a_complex = isinstance(a, Node) and _is_complex(a.meta.get("val"))
    b_complex = isinstance(b, Node) and _is_complex(b.meta.get("val"))
    if a_complex and b_complex:
        (ar, ai), (br, bi) = p.parts(a), p.parts(b)
        real = p.op(aten.sub.Tensor, p.op(aten.mul.Tensor, ar, br), p.op(aten.mul.Tensor, ai, bi))
        imaginary = p.op(aten.add.Tensor, p.op(aten.mul.Tensor, ar, bi), p.op(aten.mul.Tensor, ai, br))
        return p.stack(real, imaginary)
    pair, other = (p.pair[a], b) if a_complex else (p.pair[b], a)
    if isinstance(other, complex):
        raise p.unsupported("a product with a complex Python number")
    if isinstance(other, Node):
        other = p.op(aten.unsqueeze.default, other, -1)  # a real factor scales both parts
    return p.op(aten.mul.Tensor, pair, other)


def _add_or_sub(p: _Pairs, node: Node) -> Node:
    a, b = node.args[:2]
    if not all(isinstance(x, Node) and _is_complex(x.meta.get("val")) for x in (a, b)) or node.kwargs.get("alpha", 1) != 1:
        raise p.unsupported("only sums and differences of two complex tensors are rewritten")
    return p.op(node.target, p.pair[a], p.pair[b])


def _polar(p: _Pairs, node: Node) -> Node:
    magnitude, angle = node.args[:2]
    return p.stack(p.op(aten.mul.Tensor, magnitude, p.op(aten.cos.default, angle)),
                   p.op(aten.mul.Tensor, magnitude, p.op(aten.sin.default, angle)))


def _cast(p: _Pairs, node: Node) -> Node:
    source, out = node.args[0].meta["val"], node.meta["val"]
    if not _is_complex(out):
        raise p.unsupported("a cast from complex to real drops the imaginary part; take it with torch.view_as_real")
    if out.dtype == source.dtype:
        return p.pair[node.args[0]]  # a copy or a move between devices: the same values
    return p.op(aten._to_copy.default, p.pair[node.args[0]], dtype=_REAL[out.dtype])


def _shape_op(rewrite_args: Callable[[list], list]) -> Callable[[_Pairs, Node], Node]:
    """A shape op applied to the pair, its arguments after the tensor moved to the pair's dimensions."""

    def rewrite(p: _Pairs, node: Node) -> Node:
        return p.op(node.target, p.pair[node.args[0]], *rewrite_args(list(node.args[1:])), **node.kwargs)

    return rewrite


def _permute_dims(args: list) -> list:
    dims = args[0]
    return [[d % len(dims) for d in dims] + [len(dims)]]


_REWRITES: dict[torch._ops.OpOverload, Callable[[_Pairs, Node], Node]] = {
    aten.view_as_complex.default: lambda p, node: node.args[0],
    aten.view_as_real.default: lambda p, node: p.pair[node.args[0]],
    aten.polar.default: _polar,
    aten.mul.Tensor: _mul,
    aten.mul.Scalar: _mul,
    aten.add.Tensor: _add_or_sub,
    aten.sub.Tensor: _add_or_sub,
    aten.to.dtype_layout: _cast,
    aten.to.dtype: _cast,
    aten.to.device: _cast,
    aten._to_copy.default: _cast,
    aten.clone.default: lambda p, node: p.pair[node.args[0]],
    aten.alias.default: lambda p, node: p.pair[node.args[0]],
    aten.unsqueeze.default: _shape_op(lambda args: [_pair_dim(args[0])]),
    aten.squeeze.dim: _shape_op(lambda args: [_pair_dim(args[0])]),
    aten.select.int: _shape_op(lambda args: [_pair_dim(args[0]), *args[1:]]),
    aten.slice.Tensor: _shape_op(lambda args: [_pair_dim(args[0]) if args else 0, *args[1:]]),
    aten.transpose.int: _shape_op(lambda args: [_pair_dim(args[0]), _pair_dim(args[1])]),
    aten.permute.default: _shape_op(_permute_dims),
    aten.view.default: _shape_op(lambda args: [[*args[0], 2]]),
    aten.reshape.default: _shape_op(lambda args: [[*args[0], 2]]),
    aten.expand.default: _shape_op(lambda args: [[*args[0], 2]]),
}


def has_complex(program: ExportedProgram) -> bool:
    return any(node.op == "call_function" and _touches_complex(node) for node in program.graph.nodes)


def complex_to_real_pairs(program: ExportedProgram) -> None:
    """Rewrites every complex op of `program` (in place) into real-pair arithmetic; PartitionError names a complex op
    it cannot rewrite, a complex input or a complex output."""
    graph = program.graph
    pairs = _Pairs(graph)
    rewritten: list[Node] = []
    for node in list(graph.nodes):
        if node.op == "placeholder" and _is_complex(node.meta.get("val")):
            raise PartitionError(f"input '{node.name}' is a complex tensor; pass it as real pairs (torch.view_as_real)")
        if node.op == "output" and any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes):
            raise PartitionError("the program returns a complex tensor; return torch.view_as_real of it")
        if node.op != "call_function" or not _touches_complex(node):
            continue
        pairs.node = node
        rewritten.append(node)
        if node.target is aten._assert_tensor_metadata.default:
            continue  # asserts the complex dtype that no longer exists
        rewrite = _REWRITES.get(node.target)
        if rewrite is None:
            raise pairs.unsupported("no real-pair form")
        with graph.inserting_before(node):
            form = rewrite(pairs, node)
        if _is_complex(node.meta.get("val")):
            pairs.pair[node] = form
        else:
            node.replace_all_uses_with(form)
    for node in reversed(rewritten):
        graph.erase_node(node)
    program.graph_module.recompile()
    logger.info("%d complex op(s) rewritten as real-pair arithmetic", len(rewritten))
