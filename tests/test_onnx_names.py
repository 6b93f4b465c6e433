"""Regression: a partition input and a value inside the partition must not share an ONNX name.

A partition fed by another partition's output reads ExecuTorch's getitem of that delegate call (say
`getitem_3`); the exporter names the ONNX input after it, and names the values inside after their FX
nodes, where a getitem of a tuple op (max.dim here) can be `getitem_3` too. NVIDIA's parser then failed:
"Failed to sort the model topologically" (GR00T's two programs and XVLA's DaViT hit it).
"""

from __future__ import annotations

import collections

import onnx
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend import preflight
from et_trt_backend.engines import onnx_build
from et_trt_backend.serialization.pte import read_partitions
from et_trt_partitioner import TensorRTPartitioner
from support.nvidia_builders import tensorrt_rtx_or_skip


class _Project(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(x)


class _Pick(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        values, indices = torch.max(self.norm(x), dim=-1)  # a tuple op: getitems inside the partition
        return values + indices.float()


class _TwoParts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone, self.head = _Project(), _Pick()

    def forward(self, x):
        return self.head(self.backbone(x))


def test_partition_inputs_and_inner_values_have_distinct_names():
    rtx = tensorrt_rtx_or_skip()
    exported = torch.export.export(_TwoParts().eval(), (torch.randn(4, 16),))
    # Two parts: the head's partition reads the getitem of the backbone's delegate call (lowered first).
    recipe = {"default": {"precision": "fp32", "engine_build": "never"}, "parts": {"backbone": {"optimization_level": 5}}}
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe)])
    partitions = read_partitions(edge.to_executorch().buffer)
    head = next(p.contents for p in partitions if p.contents.part == "default")
    model = onnx.load_from_string(head.onnx)
    assert [i.name for i in model.graph.input][0].startswith("getitem")  # the form that clashed
    names = [v.name for v in model.graph.input] + [name for node in model.graph.node for name in node.output]
    assert [n for n, count in collections.Counter(names).items() if count > 1] == []
    assert preflight.check(model) == []
    for contents in (p.contents for p in partitions):
        onnx_build.parse_and_build(rtx, contents, "sm_80")  # BuildFailed carries the parser's errors
