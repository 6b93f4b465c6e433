"""Experts routed by an input (WALL-OSS's token-type MoE): masked row computations lower densely, whole.

The block is written as its authors write it (support/moe_models.TokenTypeMoE): boolean-mask row selection, one
MLP per expert, of different widths, scattered back under the mask. Its `if mask.sum() == 0: continue`
cannot be exported; without those two lines the program exports, and partitioner/masked_rows.py turns
each expert's masked rows into a dense computation selected by the mask, so the block is one partition
with a dynamic token count. The ONNX is checked against the authors' own block (branch included) in
float64 at several lengths, and built by NVIDIA's builder.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from et_trt_backend.engines import onnx_build
from et_trt_backend.serialization import external_data
from et_trt_backend.serialization.pte import read_partitions, read_plans
from et_trt_partitioner import TensorRTPartitioner
from et_trt_partitioner.pre_edge_rewrites import rewrite_for_edge
from support import moe_models, onnx_reference
from support.nvidia_builders import tensorrt_rtx_or_skip

aten = torch.ops.aten
BATCH, HIDDEN = 2, 32


def _seeded(module: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module.eval()


def _inputs(seq: int, generator: torch.Generator, types: torch.Tensor | None = None):
    hidden = torch.randn(BATCH, seq, HIDDEN, generator=generator)
    ids = torch.randint(0, 10, (BATCH, seq), generator=generator) if types is None else types
    return hidden, ids


def _export(module, seq: int = 6):
    hidden, ids = _inputs(seq, torch.Generator().manual_seed(1))
    tokens = torch.export.Dim("tokens", min=2, max=128)
    with torch.no_grad():
        return torch.export.export(module, (hidden, ids), dynamic_shapes=({1: tokens}, {1: tokens}))


def test_the_authors_block_does_not_export():
    with pytest.raises(Exception, match=r"data.dependent|[Cc]ould not guard"):
        _export(_seeded(moe_models.TokenTypeMoE(skip_empty=True)))


@pytest.mark.parametrize("routed_by", ["token_types", "comparison"])
def test_experts_routed_by_an_input_lower_whole_with_dynamic_lengths(routed_by):
    authors = _seeded(moe_models.TokenTypeMoE(skip_empty=True))
    rewritten = moe_models.TokenTypeMoE(skip_empty=False)
    rewritten.load_state_dict(authors.state_dict())
    model = rewritten.eval() if routed_by == "token_types" else moe_models.ActionTokenMoE().eval()
    if routed_by == "comparison":
        model.moe.load_state_dict(authors.state_dict())
    recipe = {"default": {"precision": "fp32", "engine_build": "never"}}
    pte = to_edge_transform_and_lower(_export(model), partitioner=[TensorRTPartitioner(recipe)]).to_executorch().buffer

    (plan,) = read_plans(pte)
    assert plan.delegate_calls == 1 and not plan.kernel_calls  # the whole block is one engine
    (partition,) = read_partitions(pte)
    contents = partition.contents
    assert [d.name for d in contents.inputs[0].dims][1] == "tokens"
    evaluator = onnx_reference.evaluator(external_data.onnx_with_weights(contents.onnx, contents.weights))
    generator = torch.Generator().manual_seed(2)
    authors64 = authors.double()
    for seq in (2, 9, 40):
        if routed_by == "token_types":  # types 0 and 1, and at 9 tokens one expert gets none
            types = torch.zeros(BATCH, seq, dtype=torch.int64) if seq == 9 else torch.randint(0, 2, (BATCH, seq),
                                                                                            generator=generator)
            hidden, ids = _inputs(seq, generator, types)
            routing = ids
        else:
            hidden, ids = _inputs(seq, generator)
            ids[0, 0] = moe_models.ActionTokenMoE.ACTION_TOKEN
            routing = ids == moe_models.ActionTokenMoE.ACTION_TOKEN
        feeds = {spec.name: t.numpy() for spec, t in zip(contents.inputs, _by_spec(contents.inputs, hidden, ids))}
        (got,) = evaluator.run(None, feeds)
        with torch.no_grad():
            expected = authors64(hidden.double(), routing).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

    onnx_build.parse_and_build(tensorrt_rtx_or_skip(), contents, "sm_80")  # BuildFailed carries the parser's errors


def _by_spec(specs, hidden, ids):
    """The inputs in the partition's order (by dtype: the hidden states are its one float input)."""
    return [hidden if spec.dtype == torch.float32 else ids for spec in specs]


class _MaskForms(torch.nn.Module):
    """One expert written in the other ways PyTorch code selects and writes back masked rows."""

    def __init__(self, form: str):
        super().__init__()
        self.expert = moe_models.TokenTypeMoE().experts[0 if form == "boolean" else 1]  # 32 or 16 features
        self.form = form

    def forward(self, hidden_states, types):
        output = hidden_states.clone()
        mask = types == 1
        if self.form == "boolean":  # out[mask] = f(x[mask])
            output[mask] = self.expert(hidden_states[mask])
        else:  # coordinates from mask.nonzero(as_tuple=True), for the read and the write
            b, s = mask.nonzero(as_tuple=True)
            output[b, s, 16:] = torch.softmax(self.expert(hidden_states[b, s][:, 16:]), dim=-1) * 2.0
        return output


def _assert_dense_and_the_same(model: torch.nn.Module, seed: int) -> None:
    """`model` exported and rewritten has no data-dependent op left and computes what `model` does, at two
    token counts, on fresh hidden states and types 0/1."""
    rewritten = rewrite_for_edge(_export(model))
    data_dependent = {aten.index.Tensor, aten.index_put.default, aten.nonzero.default, aten.nonzero_numpy.default}
    assert not [n for n in rewritten.graph.nodes if n.target in data_dependent]
    generator = torch.Generator().manual_seed(seed)
    for seq in (2, 11):
        hidden, _ = _inputs(seq, generator)
        types = torch.randint(0, 2, (BATCH, seq), generator=generator)
        with torch.no_grad():
            torch.testing.assert_close(rewritten.module()(hidden, types), model(hidden, types))


@pytest.mark.parametrize("form", ["boolean", "nonzero"])
def test_other_mask_forms_become_dense_and_compute_the_same(form):
    _assert_dense_and_the_same(_seeded(_MaskForms(form)), seed=3)


def test_experts_writing_every_feature_chain_their_writes():
    """Experts as wide as the hidden states (WALL-OSS's default dim_inputs): no slice between one expert's
    write and the next, which writes into the first's result."""
    _assert_dense_and_the_same(_seeded(moe_models.TokenTypeMoE(dim_inputs=(HIDDEN, HIDDEN))), seed=4)


class _RowMixing(torch.nn.Module):
    """Masked rows whose result depends on the other selected rows (their mean): not row-wise."""

    def __init__(self):
        super().__init__()
        self.expert = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden_states, types):
        output = torch.zeros_like(hidden_states)
        mask = types == 1
        rows = hidden_states[mask]
        batch_indices, seq_indices = torch.where(mask)
        output[batch_indices, seq_indices] = self.expert(rows - rows.mean(0, keepdim=True))
        return output


def test_a_computation_mixing_the_selected_rows_is_kept_as_written(caplog):
    exported = _export(_RowMixing().eval())
    with caplog.at_level(logging.INFO, logger="et_trt_partitioner.masked_rows"):
        rewritten = rewrite_for_edge(exported)
    assert any(n.target is aten.index.Tensor for n in rewritten.graph.nodes)
    assert "kept as written" in caplog.text and "it works along the row axis" in caplog.text
