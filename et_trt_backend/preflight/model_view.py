"""A read-only view of an ONNX model for the rules: every node (subgraphs too),
inferred types and shapes, constant values, and each node's PyTorch source line."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.inliner
from onnx import numpy_helper, shape_inference

from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN, GROUPED_MM_OP, MOE_EXPERTS_OP
from et_trt_backend.source_lines import innermost_frame

# Node metadata naming the PyTorch source a node came from. The lowering may
# write SOURCE_KEY ("file:line (function): code"); otherwise the stack trace
# torch.onnx's exporter records is used, then the node's doc_string.
SOURCE_KEY = "et_trt.source"
TORCH_STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
TORCH_FX_NODE_KEY = "pkg.torch.onnx.fx_node"

_FX_NODE = re.compile(r"%(?P<name>\S+) : .*?call_function\[target=(?P<target>[^\]]+)\]")


def source_of(node: onnx.NodeProto) -> str:
    """Where in the PyTorch model `node` came from, or "" if the model does not say."""
    props = {p.key: p.value for p in node.metadata_props}
    if props.get(SOURCE_KEY):
        return props[SOURCE_KEY]
    for text in (props.get(TORCH_STACK_TRACE_KEY, ""), node.doc_string):
        line = innermost_frame(text)
        if line:
            return line
    # No line recorded (e.g. a node a rewrite made): at least name the PyTorch op.
    fx_node = _FX_NODE.search(props.get(TORCH_FX_NODE_KEY, ""))
    if fx_node:
        return f"PyTorch op {fx_node['target']} (graph node %{fx_node['name']}; no source line recorded)"
    return ""


def attributes_of(node: onnx.NodeProto) -> dict:
    """The node's attributes as Python values, by name."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def is_standard_op(node: onnx.NodeProto) -> bool:
    """Whether the node is a default-domain ONNX operator (not a custom op)."""
    return node.domain in ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class NodeRef:
    node: onnx.NodeProto
    index: int  # position in its graph
    graph: str  # "main" or the path of the subgraph, e.g. "main/If_3.then_branch"

    @property
    def label(self) -> str:
        name = self.node.name or f"#{self.index}"
        where = "" if self.graph == "main" else f" in {self.graph}"
        return f"'{name}'{where}"


class ModelView:
    def __init__(self, model: onnx.ModelProto):
        self.opsets = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
        model = _prepared(model)
        self.model = model
        self.elem_types: dict[str, int] = {}
        self.shapes: dict[str, list[int | str | None]] = {}
        self.constants: dict[str, onnx.TensorProto] = {}
        self.used: set[str] = set()  # names read by some node or graph output
        self.nodes: list[NodeRef] = []
        self.graphs: dict[str, onnx.GraphProto] = {}  # by path, as NodeRef.graph names them
        self._walk(model.graph, "main")

    # ---- building ----------------------------------------------------------
    def _walk(self, graph: onnx.GraphProto, path: str) -> None:
        self.graphs[path] = graph
        for info in [*graph.input, *graph.output, *graph.value_info]:
            self._record_type(info)
        for init in graph.initializer:
            self.constants[init.name] = init
            self.elem_types.setdefault(init.name, init.data_type)
            self.shapes.setdefault(init.name, list(init.dims))
        self.used.update(out.name for out in graph.output)
        for index, node in enumerate(graph.node):
            self.nodes.append(NodeRef(node, index, path))
            self.used.update(name for name in node.input if name)
            if node.op_type == "Constant" and is_standard_op(node):
                tensor = _constant_tensor(node)
                if tensor is not None and node.output:
                    self.constants[node.output[0]] = tensor
            for attr in node.attribute:
                for i, sub in enumerate([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    self._walk(sub, f"{path}/{node.name or node.op_type}.{attr.name}{'' if i == 0 else i}")

    def _record_type(self, info: onnx.ValueInfoProto) -> None:
        t = info.type.tensor_type
        if not info.type.HasField("tensor_type") or t.elem_type == 0:
            return
        self.elem_types[info.name] = t.elem_type
        if t.HasField("shape"):
            self.shapes[info.name] = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
            ]

    # ---- queries -----------------------------------------------------------
    def __iter__(self) -> Iterator[NodeRef]:
        return iter(self.nodes)

    def elem_type(self, name: str) -> int | None:
        return self.elem_types.get(name)

    def shape(self, name: str) -> list[int | str | None] | None:
        return self.shapes.get(name)

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def value(self, name: str) -> np.ndarray | None:
        """A constant's value; None for non-constants and for weights kept outside the ONNX (external
        data: the rules read small constants only, which stay inside)."""
        tensor = self.constants.get(name)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    for attr in node.attribute:
        if attr.name == "value":
            return attr.t
        if attr.name in ("value_int", "value_float"):
            value = attr.i if attr.name == "value_int" else attr.f
            return numpy_helper.from_array(np.array(value, dtype=np.int64 if attr.name == "value_int" else np.float32))
        if attr.name in ("value_ints", "value_floats"):
            values = list(attr.ints) if attr.name == "value_ints" else list(attr.floats)
            return numpy_helper.from_array(np.array(values, dtype=np.int64 if attr.name == "value_ints" else np.float32))
    return None  # sparse or string constants: the attribute rule reports them


def _prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with local functions inlined and types inferred (GroupedMM included)."""
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    # ONNX cannot infer our custom ops; give each output its first input's type and re-infer
    # until nothing changes, so types flow past it.
    for _ in range(8):
        try:
            model = shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:  # an ill-formed model: rules still see what is declared
            return model
        known = {v.name for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]
                 if v.type.tensor_type.elem_type}
        types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.input]}
        types.update({t.name: t.data_type for t in model.graph.initializer})
        added = False
        for node in model.graph.node:
            if node.domain == GROUPED_MM_DOMAIN and node.op_type in (GROUPED_MM_OP, MOE_EXPERTS_OP) and node.output:
                out, a = node.output[0], node.input[0] if node.input else ""
                if out not in known and types.get(a):
                    model.graph.value_info.append(onnx.helper.make_tensor_value_info(out, types[a], None))
                    added = True
        if not added:
            return model
    return model
