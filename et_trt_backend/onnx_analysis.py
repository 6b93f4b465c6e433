"""What a partition's ONNX holds, read back from its blob: its ops, the floating types it computes in, its FP8
GroupedMMs and MoEExperts, its INT4 expert nodes and how each MoE block was lowered. `et-trt inspect` prints these;
tests check exports with them."""

from __future__ import annotations

import collections
import json
import math

import onnx
from onnx import TensorProto

from et_trt_backend.plugin_names import (
    ACTIVATION_ATTRIBUTE,
    ACTIVATIONS,
    GROUPED_MM_DOMAIN,
    GROUPED_MM_OP,
    INT4_GROUP_SIZE_ATTRIBUTE,
    MOE_EXPERTS_OP,
)
from et_trt_backend.serialization.blob import BlobError

# The ONNX model's metadata entry listing its MoE blocks, each {"block", "form", "detail", "dtype"} (JSON): form
# "MoEExperts" (fused; detail: activation, layout, sizes) or "GroupedMM" (detail: why it was not fused). The
# lowering writes it (lowering/moe_fusion.py, MoEBlockForm).
MOE_BLOCKS_METADATA_KEY = "et_trt.moe_blocks"


def load_onnx(partition) -> onnx.ModelProto:
    """The ONNX model of a partition (serialization.pte.Partition); BlobError if its bytes do not parse."""
    try:
        return onnx.load_from_string(partition.contents.onnx)
    except Exception as e:  # protobuf raises DecodeError and others
        raise BlobError(f"part {partition.contents.part!r}: the blob's ONNX does not parse ({e})") from e


def onnx_ops(model: onnx.ModelProto) -> tuple[collections.Counter, int | None]:
    """How many nodes of each op type the graph has (custom ops as "domain::op"), and its default-domain opset."""
    ops = collections.Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph.node
    )
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), None)
    return ops, opset


def onnx_precision(model: onnx.ModelProto) -> dict[str, dict[str, int]]:
    """The floating types the ONNX really holds (what the engine computes in, TensorRT networks being
    strongly typed): for its weights (initializers), the values its nodes compute and its inputs and
    outputs, how many tensors of each type."""
    names = {TensorProto.BFLOAT16: "bf16", TensorProto.FLOAT16: "fp16", TensorProto.FLOAT: "fp32",
             TensorProto.DOUBLE: "fp64"}
    graph = model.graph

    def count(types) -> dict[str, int]:  # in the order of `names`
        counted = collections.Counter(types)
        return {name: counted[t] for t, name in names.items() if counted[t]}

    return {
        "weights": count(t.data_type for t in graph.initializer),
        "computed": count(v.type.tensor_type.elem_type for v in graph.value_info),
        "inputs/outputs": count(v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]),
    }


def is_grouped_mm(node: onnx.NodeProto) -> bool:
    return (node.domain, node.op_type) == (GROUPED_MM_DOMAIN, GROUPED_MM_OP)


def node_group_size(node: onnx.NodeProto) -> int:
    """The node's INT4 group size (INT4_GROUP_SIZE_ATTRIBUTE); 0 for weights not INT4."""
    return next((a.i for a in node.attribute if a.name == INT4_GROUP_SIZE_ATTRIBUTE), 0)


def fp8_grouped_mms(model: onnx.ModelProto) -> list[dict]:
    """The ONNX's FP8 GroupedMMs (4 inputs: b_scale, no INT4 group size), each with its node name, weights and their
    bytes, and whether it takes a gate+up output and computes its SwiGLU (activation 1)."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if not is_grouped_mm(node) or len(node.input) != 4 or node_group_size(node):
            continue
        shape = dims.get(node.input[1], [])
        activation = next((a.i for a in node.attribute if a.name == ACTIVATION_ATTRIBUTE), ACTIVATIONS["none"])
        found.append({"node": node.name, "weights": node.input[1], "shape": shape,
                      "weights_bytes": math.prod(shape), "scales_bytes": 4 * math.prod(dims.get(node.input[3], [])),
                      "swiglu": activation == ACTIVATIONS["swiglu"]})
    return found


def fp8_moe_experts(model: onnx.ModelProto) -> list[dict]:
    """The ONNX's MoEExperts nodes with FP8 weights (all 9 inputs, no INT4 group size), each with its node name and
    the bytes of its e4m3 weights (inputs 3, 4) and of their float32 scales (7, 8)."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    return [{"node": node.name,
             "weights_bytes": sum(math.prod(dims.get(node.input[i], [])) for i in (3, 4)),
             "scales_bytes": sum(4 * math.prod(dims.get(node.input[i], [])) for i in (7, 8))}
            for node in model.graph.node
            if (node.domain, node.op_type) == (GROUPED_MM_DOMAIN, MOE_EXPERTS_OP) and len(node.input) == 9
            and not node_group_size(node)]


def int4_expert_nodes(model: onnx.ModelProto) -> list[dict]:
    """The ONNX's nodes with INT4 weights (GroupedMM and MoEExperts of a nonzero group size), each with its node name,
    op, group size, and the bytes of its packed weights and of their bfloat16 scales."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        group_size = node_group_size(node)
        if node.domain != GROUPED_MM_DOMAIN or not group_size:
            continue
        # GroupedMM: b (input 1), b_scale (3); MoEExperts: w_gate_up, w_down (3, 4), their scales (7, 8).
        weights, scales = ((1,), (3,)) if node.op_type == GROUPED_MM_OP else ((3, 4), (7, 8))
        found.append({"node": node.name, "op": node.op_type, "group_size": group_size,
                      "weights_bytes": sum(math.prod(dims.get(node.input[i], [])) for i in weights),
                      "scales_bytes": sum(2 * math.prod(dims.get(node.input[i], [])) for i in scales)})
    return found


def moe_blocks(model: onnx.ModelProto) -> list[dict[str, str]]:
    """The partition's MoE blocks as the lowering recorded them (MOE_BLOCKS_METADATA_KEY); [] for none, or for
    blobs written before the record."""
    entry = next((p.value for p in model.metadata_props if p.key == MOE_BLOCKS_METADATA_KEY), None)
    return json.loads(entry) if entry else []
