"""Rows under a boolean mask whose number the program fixes (partitioner/counted_rows.py): one engine, checked.

The module below is WALL-OSS's flow-matching step in miniature (lerobot 0.4.4, wall_x/modeling_wall_x.py,
`predict`'s `step`, whole in test_lerobot_policies.py): the action embeddings go into the prompt's action
tokens (`embeds[mask] = values`), a layer runs over every token, the action tokens' rows come back out
(`hidden[mask]`, reshaped to the action chunk). Both masked ops have a row count the program fixes, so they
become static reads and writes by rank, and the program gets an engine check on the count: lowered, the
partition is one engine whose ONNX matches PyTorch (float64) wherever the action tokens sit, and whose check
outputs are false where the prompt holds another number of action tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from torch import nn

from et_trt_backend.engines import onnx_build
from et_trt_backend.serialization import external_data
from et_trt_backend.serialization.pte import read_partitions, read_plans
from et_trt_partitioner import TensorRTPartitioner
from et_trt_partitioner.pre_edge_rewrites import rewrite_for_edge
from support import onnx_reference
from support.nvidia_builders import tensorrt_rtx_or_skip

aten = torch.ops.aten
BATCH, HIDDEN, HORIZON, ACTION = 1, 16, 4, 3
ACTION_TOKEN = 7
DATA_DEPENDENT = {aten.index.Tensor, aten.index_put.default, aten.nonzero.default, aten.nonzero_numpy.default}


class ActionSlots(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_actions = nn.Linear(ACTION, HIDDEN)
        self.mixer = nn.Linear(HIDDEN, HIDDEN)
        self.project_back = nn.Linear(HIDDEN, ACTION)

    def forward(self, input_ids, inputs_embeds, noisy_action):
        action_mask = input_ids == ACTION_TOKEN
        embeds = inputs_embeds.clone()
        embeds[action_mask] = self.embed_actions(noisy_action).reshape(-1, HIDDEN)
        # every token sees the others: the action rows must come back from where they went
        hidden = torch.tanh(self.mixer(embeds)) + embeds.cumsum(1)
        return self.project_back(hidden[action_mask]).reshape(noisy_action.shape[0], HORIZON, ACTION)


def _inputs(seq: int, generator: torch.Generator, actions: int = HORIZON):
    ids = torch.randint(0, ACTION_TOKEN, (BATCH, seq), generator=generator)
    slots = torch.randperm(seq, generator=generator)[:actions]
    ids[0, slots] = ACTION_TOKEN
    return (ids, torch.randn(BATCH, seq, HIDDEN, generator=generator),
            torch.randn(BATCH, HORIZON, ACTION, generator=generator))


def _model() -> ActionSlots:
    torch.manual_seed(0)
    return ActionSlots().eval()


def _export(model: nn.Module):
    tokens = torch.export.Dim("tokens", min=HORIZON + 1, max=64)
    with torch.no_grad():
        return torch.export.export(model, _inputs(9, torch.Generator().manual_seed(1)),
                                   dynamic_shapes=({1: tokens}, {1: tokens}, None))


def test_the_masked_reads_and_writes_become_static_and_checked():
    model = _model()
    rewritten = rewrite_for_edge(_export(model))
    assert not [n for n in rewritten.graph.nodes if n.target in DATA_DEPENDENT]
    assert sum(n.target is aten._assert_async.msg for n in rewritten.graph.nodes) == 2
    assert not [n for n in rewritten.graph.nodes if n.target is aten._assert_scalar.default]  # on a static size now
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for seq in (HORIZON + 1, 9, 40):
            args = _inputs(seq, generator)
            torch.testing.assert_close(rewritten.module()(*args), model(*args), rtol=0, atol=0)
        for actions in (HORIZON - 1, HORIZON + 1):
            with pytest.raises(RuntimeError, match=r"x\[mask\] = values at test_counted_rows.py:\d+ \(forward\): "
                                                   r".*must select 4 rows"):
                rewritten.module()(*_inputs(12, generator, actions))


def test_the_step_is_one_engine_whose_checks_catch_another_row_count():
    model = _model()
    recipe = {"default": {"precision": "fp32", "engine_build": "never", "kernel_archs": ["sm_80"]}}
    pte = to_edge_transform_and_lower(_export(model), partitioner=[TensorRTPartitioner(recipe)]).to_executorch().buffer
    (plan,) = read_plans(pte)
    assert plan.delegate_calls == 1 and not plan.kernel_calls
    (partition,) = read_partitions(pte)
    contents = partition.contents
    assert len(contents.outputs) == 1 and len(contents.checks) == 2
    messages = [c.message for c in contents.checks]
    assert messages[0].startswith("x[mask] = values at test_counted_rows.py:")  # the file's name only
    assert messages[1].startswith("x[mask] at test_counted_rows.py:") and "must select 4 rows" in messages[1]
    assert all(c.output.dtype == torch.bool and not c.output.dims for c in contents.checks)

    evaluator = onnx_reference.evaluator(external_data.onnx_with_weights(contents.onnx, contents.weights))
    names = [spec.name for spec in contents.inputs]
    model64 = model.double()
    generator = torch.Generator().manual_seed(3)
    for seq, actions in ((HORIZON + 1, HORIZON), (17, HORIZON), (40, HORIZON), (17, HORIZON + 2), (17, 1)):
        ids, embeds, noisy = _inputs(seq, generator, actions)
        by_name = {"input_ids": ids, "inputs_embeds": embeds, "noisy_action": noisy}
        got, *checks = evaluator.run(None, {name: by_name[name].numpy() for name in names})
        assert [bool(c) for c in checks] == [actions == HORIZON] * 2, (seq, actions)
        if actions == HORIZON:
            with torch.no_grad():
                expected = model64(ids, embeds.double(), noisy.double()).numpy()
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

    onnx_build.parse_and_build(tensorrt_rtx_or_skip(), contents, "sm_80")  # BuildFailed carries the parser's errors


class _OneRow(nn.Module):
    """One value row written to every masked row (PyTorch broadcasts it): any number of rows, no check."""

    def forward(self, x, types, row):
        out = x.clone()
        out[types == 1] = row
        return out


def test_one_value_row_is_written_to_any_number_of_rows_without_a_check():
    model = _OneRow()
    tokens = torch.export.Dim("tokens", min=2, max=64)
    generator = torch.Generator().manual_seed(4)
    example = (torch.randn(2, 6, HIDDEN, generator=generator), torch.randint(0, 2, (2, 6), generator=generator),
               torch.randn(1, HIDDEN, generator=generator))
    rewritten = rewrite_for_edge(torch.export.export(model, example, dynamic_shapes=({1: tokens}, {1: tokens}, None)))
    assert not [n for n in rewritten.graph.nodes if n.target in DATA_DEPENDENT or n.target is aten._assert_async.msg]
    for seq in (2, 11):
        for types in (torch.zeros(2, seq, dtype=torch.int64), torch.randint(0, 2, (2, seq), generator=generator)):
            args = (torch.randn(2, seq, HIDDEN, generator=generator), types,
                    torch.randn(1, HIDDEN, generator=generator))
            torch.testing.assert_close(rewritten.module()(*args), model(*args), rtol=0, atol=0)


class _Unfixed(nn.Module):
    """A selection whose row count nothing fixes: it stays as written (with ExecuTorch)."""

    def forward(self, x, types):
        return x[types == 1].sum(0)


def test_a_selection_of_unfixed_count_is_kept():
    tokens = torch.export.Dim("tokens", min=2, max=64)
    example = (torch.randn(2, 6, HIDDEN), torch.randint(0, 2, (2, 6)))
    rewritten = rewrite_for_edge(torch.export.export(_Unfixed(), example, dynamic_shapes=({1: tokens}, {1: tokens})))
    assert any(n.target is aten.index.Tensor for n in rewritten.graph.nodes)
    assert not any(n.target is aten._assert_async.msg for n in rewritten.graph.nodes)


class _OwnCheck(nn.Module):
    """A model's own data check: torch._assert_async(condition, message)."""

    def forward(self, x):
        torch._assert_async(x.abs().amax() < 100.0, "x is out of range: every |x| must be below 100")
        return x * 2.0


def test_a_models_own_assert_async_is_an_engine_check():
    recipe = {"default": {"precision": "fp32", "engine_build": "never", "kernel_archs": ["sm_80"]}}
    exported = torch.export.export(_OwnCheck(), (torch.randn(2, 8),))
    pte = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe)]).to_executorch().buffer
    (partition,) = read_partitions(pte)
    (check,) = partition.contents.checks
    assert check.message == "x is out of range: every |x| must be below 100"
    evaluator = onnx_reference.evaluator(external_data.onnx_with_weights(partition.contents.onnx,
                                                                        partition.contents.weights))
    x = torch.randn(2, 8).numpy()
    for scale, holds in ((1.0, True), (1000.0, False)):
        got, ok = evaluator.run(None, {partition.contents.inputs[0].name: x * scale})
        np.testing.assert_allclose(got, x * scale * 2.0, rtol=1e-6)
        assert bool(ok) is holds
    onnx_build.parse_and_build(tensorrt_rtx_or_skip(), partition.contents, "sm_80")
