"""Routing rewrites: counting sort, bounded bincount, top-k combine, GroupedMM semantics, errors.

Programs here are plain torch.export programs (ATen), which lower_to_onnx takes
as well as edge programs; each ONNX is run by onnx's reference evaluator.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch

from et_trt_backend import op_support, preflight
from et_trt_backend.lowering import LoweringError, lower_to_onnx
from et_trt_backend.lowering import ops as lowering_ops
from et_trt_backend.options import CompileOptions
from et_trt_backend.tensorrt_limits import TOPK_MAX_K
from support import onnx_reference

torch.manual_seed(0)


class _SortExperts(torch.nn.Module):
    """argsort (or sort) of top-k expert ids; `transposed` flattens them expert-slot-major, which
    leaves their range known but not their per-token structure (the general counting sort)."""

    def __init__(self, k: int, stable: bool = True, transposed: bool = False):
        super().__init__()
        self.k, self.stable, self.transposed = k, stable, transposed

    def forward(self, scores):
        ids = torch.topk(scores, self.k, dim=-1).indices
        ids = (ids.t() if self.transposed else ids).reshape(-1)
        if self.stable:
            return torch.argsort(ids, stable=True)
        return torch.sort(ids)[0]

    def reference(self, scores):
        ids = torch.topk(scores, self.k, dim=-1).indices
        return torch.argsort((ids.t() if self.transposed else ids).reshape(-1), stable=True)


def _onnx(module, *args, dynamic_shapes=None, **options) -> onnx.ModelProto:
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return lower_to_onnx(program, CompileOptions(**options)).with_weights()


def _run(model: onnx.ModelProto, *inputs: np.ndarray) -> list[np.ndarray]:
    names = [i.name for i in model.graph.input]
    return onnx_reference.evaluator(model).run(None, dict(zip(names, inputs)))


def _sort_tensor_bytes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of every tensor the graph computes from the expert ids (static shapes): not the
    router's TopK outputs nor the reshapes that flatten its ids, nor constants."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    info = {v.name: v.type.tensor_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    router = set()
    sizes = {}
    for node in inferred.graph.node:
        if node.op_type in ("TopK", "Constant") or (
                node.op_type in ("Transpose", "Reshape") and node.input[0] in router):
            router.update(node.output)
            continue
        for name in node.output:
            tensor_type = info[name]
            dims = [d.dim_value for d in tensor_type.shape.dim]
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).itemsize
            sizes[name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    return sizes


@pytest.mark.parametrize("transposed", [False, True], ids=["per-token", "general"])
def test_counting_sort_is_a_stable_sort_of_expert_ids(transposed):
    module = _SortExperts(k=4, transposed=transposed)
    model = _onnx(module, torch.randn(50, 16), dynamic_shapes=({0: torch.export.Dim("tokens", max=1000)},))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("TopK") == 1 and "CumSum" in ops  # the router's TopK only
    assert ("Equal" in ops) == transposed  # the general form compares ids with every bin
    for tokens in (1, 3, 333):
        scores = torch.randn(tokens, 16)
        scores[: tokens // 2, :4] += 10.0  # pile rows onto experts 0-3, leave others empty
        (perm,) = _run(model, scores.numpy())
        np.testing.assert_array_equal(perm, module.reference(scores).numpy())


@pytest.mark.parametrize(("transposed", "wide_tensors", "total_mb"), [
    (False, [8750 * 128 * 4] * 3, 15.68),  # [T, E] float32 zeros, indicator (scattered ones), cumsum
    (True, [70000 * 128 * 4] * 2 + [70000 * 128], 83.44),  # [N, E] float32 one-hot, cumsum; bool compare
], ids=["per-token", "general"])
def test_counting_sort_memory_at_70000_rows_and_128_experts(transposed, wide_tensors, total_mb):
    """The figures in translations.counting_sort's docstring, computed from the ONNX graph."""
    tokens, experts, k = 8750, 128, 8  # 70,000 routed rows
    module = _SortExperts(k, transposed=transposed)
    model = _onnx(module, torch.randn(tokens, experts))
    sizes = _sort_tensor_bytes(model)
    assert sorted((b for b in sizes.values() if b >= tokens * experts * 4), reverse=True) == wide_tensors
    assert round(sum(sizes.values()) / 1e6, 2) == total_mb
    # And it sorts correctly at that size.
    scores = torch.randn(tokens, experts)
    (perm,) = _run(model, scores.numpy())
    np.testing.assert_array_equal(perm, module.reference(scores).numpy())


def test_short_float_sort_becomes_one_topk():
    class SortScores(torch.nn.Module):
        def forward(self, x):
            return torch.argsort(x, stable=True)

    model = _onnx(SortScores(), torch.randn(300))
    assert [n.op_type for n in model.graph.node].count("TopK") == 1
    x = torch.randn(300)
    np.testing.assert_array_equal(_run(model, x.numpy())[0], torch.argsort(x).numpy())


def test_op_support_lowering_and_preflight_share_the_topk_limit():
    """The longest float sort op support claims becomes one TopK that pre-flight passes; one
    element more, op support refuses it and so does the lowering."""
    class SortScores(torch.nn.Module):
        def forward(self, x):
            return torch.argsort(x, stable=True)

    def claimed(program):
        (sort,) = [n for n in program.graph.nodes if n.target is torch.ops.aten.argsort.stable]
        return op_support.unsupported_reason(sort) is None

    longest = torch.export.export(SortScores(), (torch.randn(TOPK_MAX_K),))
    assert claimed(longest)
    model = lower_to_onnx(longest, CompileOptions()).onnx
    assert [n.op_type for n in model.graph.node].count("TopK") == 1 and preflight.check(model) == []
    too_long = torch.export.export(SortScores(), (torch.randn(TOPK_MAX_K + 1),))
    assert not claimed(too_long)
    with pytest.raises(LoweringError, match=f"sorts {TOPK_MAX_K + 1} rows"):
        lower_to_onnx(too_long, CompileOptions())


def test_long_sort_of_unknown_values_is_refused_with_its_source_line():
    class SortScores(torch.nn.Module):
        def forward(self, x):
            return torch.argsort(x, stable=True)  # the line the error must name

    where = r"test_lowering_routing.py:\d+ \(forward\): return torch.argsort"
    with pytest.raises(LoweringError, match=where + ".*sorts 5000 rows"):
        _onnx(SortScores(), torch.randn(5000))


def test_index_add_with_other_indices_adds_duplicates_by_a_one_hot_matmul():
    class IndexAdd(torch.nn.Module):
        def forward(self, x, index):
            return torch.ones(4, 8, dtype=x.dtype).index_add(0, index, x)

    model = _onnx(IndexAdd(), torch.randn(6, 8), torch.tensor([0, 1, 1, 2, 3, 3]))
    assert "MatMul" in {n.op_type for n in model.graph.node}
    x, index = torch.randn(6, 8), torch.tensor([3, 1, 2, 0, 3, 3])
    (got,) = _run(model, x.numpy(), index.numpy())
    np.testing.assert_allclose(got, IndexAdd()(x.double(), index).float().numpy(), rtol=1e-6, atol=1e-6)


def test_scatter_add_with_other_indices_is_refused():
    class Scatter(torch.nn.Module):
        def forward(self, x, index):
            return torch.zeros(4, 8).scatter_add(0, index[:, None].expand(6, 8), x)

    with pytest.raises(LoweringError, match="accumulating scatter.*scatter_add"):
        _onnx(Scatter(), torch.randn(6, 8), torch.tensor([0, 1, 1, 2, 3, 3]))


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("kernel", [False, True], ids=["kernel-off", "fp32-has-no-kernel"])
def test_dense_grouped_mm_follows_the_contract_for_any_offsets(trans_b, kernel, caplog):
    class GroupedMM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 24, 16) if trans_b else torch.randn(4, 16, 24))

        def forward(self, a, offs):
            return lowering_ops.grouped_mm(a, self.w, offs, trans_b)

    module = GroupedMM()
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.lowering"):
        model = _onnx(module, torch.randn(10, 16), torch.tensor([2, 5, 7, 10], dtype=torch.int32),
                      grouped_gemm_kernel=kernel)
    assert "GroupedMM" not in [n.op_type for n in model.graph.node]
    why = "no grouped-GEMM kernel for torch.float32" if kernel else "grouped_gemm_kernel = false"
    assert f"lowered densely ({why}): 4 x the multiply-adds" in caplog.text
    for offs in ([2, 5, 7, 10], [3, 1, 12, 2], [-4, 0, 6, 6], [0, 0, 0, 0], [10, 10, 10, 10]):
        a = torch.randn(10, 16)
        offs = torch.tensor(offs, dtype=torch.int32)
        expected = lowering_ops.grouped_mm(a, module.w.detach(), offs, trans_b)
        (got,) = _run(model, a.numpy(), offs.numpy())
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
        # and the reference GroupedMM (the custom op's test implementation) agrees
        np.testing.assert_allclose(
            onnx_reference.grouped_mm_reference(a.numpy(), module.w.detach().numpy(), offs.numpy(), trans_b),
            expected.numpy(), rtol=1e-5, atol=1e-5)


def test_grouped_mm_kernel_form_stores_weights_once_untransposed():
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 32, 16, dtype=torch.bfloat16))  # [G, N, K]

        def forward(self, a, offs):
            return torch._grouped_mm(a, self.w.transpose(-2, -1), offs=offs)

    model = _onnx(Experts(), torch.randn(8, 16, dtype=torch.bfloat16), torch.tensor([2, 4, 6, 8], dtype=torch.int32))
    (node,) = [n for n in model.graph.node if n.op_type == "GroupedMM"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "et_trt"
    assert attrs == {"trans_b": 1, "activation": 0, "group_size": 0, "plugin_version": b"1", "plugin_namespace": b"et_trt"}
    (weight,) = [t for t in model.graph.initializer if t.name == node.input[1]]
    assert list(weight.dims) == [4, 32, 16]
    assert "Transpose" not in [n.op_type for n in model.graph.node]
    assert sum(int(np.prod(t.dims)) for t in model.graph.initializer if len(t.dims) == 3) == 4 * 32 * 16


def test_bincount_of_expert_ids_gets_a_static_size():
    class Counts(torch.nn.Module):
        def forward(self, scores):
            ids = torch.topk(scores, 2, dim=-1).indices.reshape(-1)
            return torch.cumsum(torch.bincount(ids, minlength=8), 0)

    try:
        program = torch.export.export(Counts(), (torch.randn(20, 8),))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch.export cannot trace bincount here: {type(e).__name__}")
    model = lower_to_onnx(program, CompileOptions()).onnx
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [8]
    scores = torch.randn(20, 8)
    ids = torch.topk(scores, 2, dim=-1).indices.reshape(-1)
    np.testing.assert_array_equal(_run(model, scores.numpy())[0], torch.cumsum(torch.bincount(ids, minlength=8), 0))


def test_dynamic_dims_keep_their_names_and_ranges():
    import io

    from support import moe_models
    from et_trt_backend.options import ShapeRange

    program = moe_models.export(moe_models.bf16(moe_models.GroupedMoE()))  # Dim("tokens", 2..256)
    lowered = lower_to_onnx(program, CompileOptions(grouped_gemm_kernel=False))
    (tokens, _), = [spec.dims for spec in lowered.inputs]
    assert (tokens.name, tokens.min, tokens.opt, tokens.max) == ("tokens", 2, 256, 256)
    assert lowered.onnx.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "tokens"
    # A reloaded program has lost its Dim names: "input:axis" names the dimension, and a range
    # given under that name applies.
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    options = CompileOptions(grouped_gemm_kernel=False, shape_ranges={"hidden_states:0": ShapeRange(4, 8, 16)})
    lowered = lower_to_onnx(torch.export.load(buffer), options)
    (tokens, _), = [spec.dims for spec in lowered.inputs]
    assert (tokens.name, tokens.min, tokens.opt, tokens.max) == ("hidden_states:0", 4, 8, 16)
    assert lowered.onnx.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "hidden_states:0"


@pytest.mark.parametrize("high", [8, 7], ids=["max=E", "max=E-1"])
def test_histc_of_expert_ids_counts_per_token(high):
    class Counts(torch.nn.Module):
        def forward(self, scores):
            ids = torch.topk(scores, 2, dim=-1).indices.reshape(-1)
            return torch.histc(ids.float(), bins=8, min=0, max=high)

    model = _onnx(Counts(), torch.randn(20, 8), dynamic_shapes=({0: torch.export.Dim("tokens", max=70000)},))
    ops = [n.op_type for n in model.graph.node]
    assert "ScatterElements" in ops and "Less" not in ops  # the [T, E] indicator, no bin-edge compare
    for tokens in (1, 9, 700):
        scores = torch.randn(tokens, 8)
        ids = torch.topk(scores, 2, dim=-1).indices.reshape(-1)
        (counts,) = _run(model, scores.numpy())
        np.testing.assert_array_equal(counts, torch.histc(ids.float(), bins=8, min=0, max=high).numpy())


def test_histc_with_other_bins_keeps_the_bin_edge_form():
    class Counts(torch.nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=5, min=-1.0, max=1.0)

    model = _onnx(Counts(), torch.randn(50))
    x = torch.randn(50)
    np.testing.assert_array_equal(_run(model, x.numpy())[0], torch.histc(x, bins=5, min=-1.0, max=1.0).numpy())


class _SparseMixerSort(torch.nn.Module):
    """PhiMoE's "sparse mixer" ids: the best expert and the best of the rest, two max results
    concatenated, then sorted stably."""

    def forward(self, scores):
        _, first = scores.max(-1, keepdim=True)
        _, second = scores.scatter(-1, first, float("-inf")).max(-1, keepdim=True)
        return torch.argsort(torch.cat([first, second], dim=-1).reshape(-1), stable=True)


def test_concatenated_max_ids_get_a_counting_sort():
    # 2 x 3000 ids: beyond TensorRT's TopK limit, so only the counting sort can sort them.
    model = _onnx(_SparseMixerSort(), torch.randn(3000, 8),
                  dynamic_shapes=({0: torch.export.Dim("tokens", max=4000)},))
    assert "TopK" not in [n.op_type for n in model.graph.node]
    for tokens in (1, 5, 3000):
        scores = torch.randn(tokens, 8)
        scores[: tokens // 2, :2] += 10.0  # crowd experts 0 and 1
        (perm,) = _run(model, scores.numpy())
        np.testing.assert_array_equal(perm, _SparseMixerSort()(scores).numpy())
