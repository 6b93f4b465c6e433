"""Complex-number rotary embeddings (DeepSeek-V2's: torch.polar, view_as_complex, a complex product,
view_as_real) are rewritten as real pairs before ExecuTorch's edge decompositions, delegated whole, and their
ONNX matches the complex arithmetic PyTorch computes; a complex op without a real-pair form is refused naming
the op and its line (the whole DeepSeek-V2 model: test_transformers_heldout.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.serialization import external_data
from et_trt_partitioner import PartitionError, TensorRTPartitioner
from support.lowering import delegated_parts, run_reference_evaluator

HEADS, DIM = 2, 8


class ComplexRotary(torch.nn.Module):
    """The rotary embedding as DeepSeek-V2 writes it, with a scaled table and a complex sum."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM)), persistent=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor:  # [1, heads, tokens, dim]
        positions = torch.arange(q.shape[2]).float()[None, :, None]
        freqs = positions * self.inv_freq
        cis = torch.polar(torch.ones_like(freqs), freqs) * 0.5  # [1, tokens, dim / 2], complex64
        rows = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        turned = rows * cis.unsqueeze(1)
        both = turned + turned.transpose(2, 3).transpose(2, 3)
        return torch.view_as_real(both).flatten(3).type_as(q)


def _export(module, tokens=6):
    q = torch.randn(1, HEADS, tokens, DIM)
    return torch.export.export(module, (q,), dynamic_shapes=({2: torch.export.Dim("tokens", min=1, max=64)},))


@pytest.fixture(scope="module")
def rotary():
    module = ComplexRotary()
    edge = to_edge_transform_and_lower(_export(module), partitioner=[TensorRTPartitioner()])
    return module, edge


def test_complex_rotary_is_delegated_whole(rotary):
    _, edge = rotary
    outside = [n.target for n in edge.exported_program().graph.nodes if n.op == "call_function"
               and n.target is not torch.ops.higher_order.executorch_call_delegate
               and getattr(n.target, "__name__", "") != "getitem"]
    assert outside == []
    assert len(delegated_parts(edge)) == 1


@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_the_onnx_matches_the_complex_arithmetic(rotary, tokens):
    module, edge = rotary
    ((_, contents),) = delegated_parts(edge)
    q = torch.randn(1, HEADS, tokens, DIM)
    expected = module(q.double()).numpy()  # complex128 in PyTorch: the reference
    model = external_data.onnx_with_weights(contents.onnx, contents.weights)
    (got,) = run_reference_evaluator(model, {contents.inputs[0].name: q.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


class ComplexMagnitude(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        rows = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2))
        return rows.abs()  # no real-pair form here


def test_a_complex_op_without_a_real_pair_form_is_named():
    with pytest.raises(PartitionError, match=r"aten\.abs\.default on complex tensors at .*test_complex_pairs\.py"
                                             r".*rows\.abs\(\).*no real-pair form"):
        to_edge_transform_and_lower(_export(ComplexMagnitude()), partitioner=[TensorRTPartitioner()])
