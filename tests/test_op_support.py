"""Op support rules: each family accepts what the TensorRT lowering handles and names what it does not."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph

from et_trt_backend import op_support
from et_trt_backend.op_support import routing
from support.fx_nodes import call, meta

aten = torch.ops.aten


def test_public_api():
    assert aten._grouped_mm.default in op_support.SUPPORTED_TARGETS
    assert set(op_support.PRESERVED_OPS) <= op_support.SUPPORTED_TARGETS
    # A preserved op must not be core ATen, else preserving it would be pointless.
    assert all(torch.Tag.core not in op.tags for op in op_support.PRESERVED_OPS)
    assert all(isinstance(op, torch._ops.OpOverload) for op in op_support.SUPPORTED_TARGETS)


def test_structural_nodes_are_supported():
    node = call(operator.mul, 2, 3)
    assert op_support.unsupported_reason(node) is None
    graph = Graph()
    assert op_support.unsupported_reason(graph.placeholder("x")) is None


def test_unknown_op_is_named():
    reason = op_support.unsupported_reason(call(aten.convolution_backward.default, meta(2, 2)))
    assert "convolution_backward" in reason and "no TensorRT lowering" in reason


def test_bincount_of_anything_but_expert_ids_advises_histc():
    reason = op_support.unsupported_reason(call(aten.bincount.default, meta(8, dtype=torch.int64)))
    assert "minlength=num_experts" in reason and "histc" in reason


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_dtypes_outside_tensorrt_are_refused(dtype):
    # float64 only where the part does not compute it in float32 (truncate_double, on by default)
    node = call(aten.add.Tensor, meta(4, dtype=dtype), meta(4, dtype=dtype))
    reason = op_support.unsupported_reason(node, truncate_double=False)
    assert "dtype" in reason and str(dtype).removeprefix("torch.") in reason
    assert (op_support.unsupported_reason(node) is None) == (dtype == torch.float64)


def test_rank_limit():
    assert "rank 9" in op_support.unsupported_reason(call(aten.relu.default, meta(*[1] * 9)))
    assert op_support.unsupported_reason(call(aten.relu.default, meta(*[1] * 8))) is None


def test_elementwise_dtypes():
    assert op_support.unsupported_reason(call(aten.sigmoid.default, meta(4))) is None
    assert "int32" in op_support.unsupported_reason(call(aten.sigmoid.default, meta(4, dtype=torch.int32)))
    assert op_support.unsupported_reason(call(aten.div.Tensor_mode, meta(4, dtype=torch.int64), meta(4, dtype=torch.int64), rounding_mode="floor")) is None
    assert op_support.unsupported_reason(call(aten.bitwise_not.default, meta(4, dtype=torch.bool))) is None
    assert "bool" in op_support.unsupported_reason(call(aten.bitwise_not.default, meta(4, dtype=torch.int32)))


class TestGroupedMM:
    a, b_t = meta(16, 32), meta(4, 64, 32).transpose(-2, -1)  # b as stored [G, N, K], viewed [G, K, N]
    offs = meta(4, dtype=torch.int32)

    def test_moe_form_is_supported(self):
        assert op_support.unsupported_reason(call(aten._grouped_mm.default, self.a, self.b_t, self.offs)) is None

    def test_fp32_is_supported(self):
        node = call(aten._grouped_mm.default, meta(16, 32, dtype=torch.float32), meta(4, 32, 8, dtype=torch.float32), self.offs)
        assert op_support.unsupported_reason(node) is None

    @pytest.mark.parametrize(
        "args, kwargs, expected",
        [
            ((meta(16, 32), meta(4, 32, 8), meta(4, dtype=torch.int64)), {}, "int32"),
            ((meta(16, 32), meta(4, 32, 8)), {}, "offs is required"),
            ((meta(4, 16, 32), meta(4, 32, 8)), {}, "ranks 3 and 3"),
            ((meta(16, 32), meta(4, 32, 8), meta(4, dtype=torch.int32), meta(4, 8)), {}, "bias"),
            ((meta(16, 32), meta(4, 32, 8), meta(3, dtype=torch.int32)), {}, "one entry per expert"),
            ((meta(16, 32), meta(4, 32, 8, dtype=torch.float16), meta(4, dtype=torch.int32)), {}, "share one of"),
        ],
    )
    def test_refusals(self, args, kwargs, expected):
        reason = op_support.unsupported_reason(call(aten._grouped_mm.default, *args, **kwargs))
        assert reason is not None and expected in reason


class TestRouting:
    def test_topk_limit(self):
        assert op_support.unsupported_reason(call(aten.topk.default, meta(4, 8), 2)) is None
        assert "3840" in op_support.unsupported_reason(call(aten.topk.default, meta(4, 5000), 4000))

    def test_float_sort_is_bounded_by_topk(self):
        assert op_support.unsupported_reason(call(aten.sort.default, meta(100))) is None
        assert "3840" in op_support.unsupported_reason(call(aten.sort.default, meta(5000)))

    def test_expert_id_sort_has_no_length_limit(self):
        graph = Graph()
        scores = graph.placeholder("scores")
        scores.meta["val"] = meta(3000, 8, dtype=torch.float32)
        topk = graph.call_function(aten.topk.default, (scores, 2))
        ids = graph.call_function(operator.getitem, (topk, 1))
        flat = graph.call_function(aten.view_copy.default, (ids, [6000]))
        flat.meta["val"] = meta(6000, dtype=torch.int64)
        order = graph.call_function(aten.argsort.stable, (flat,), {"stable": True})
        assert routing.integer_key_bound(flat) == 8
        assert op_support.unsupported_reason(order) is None

    def test_histc_needs_a_static_range(self):
        assert op_support.unsupported_reason(call(aten.histc.default, meta(8, dtype=torch.float32), 4, 0, 3)) is None
        assert "min < max" in op_support.unsupported_reason(call(aten.histc.default, meta(8, dtype=torch.float32), 4))

    def test_plain_index_put(self):
        x, idx, v = meta(8, 4), meta(8, dtype=torch.int64), meta(8, 4)
        assert op_support.unsupported_reason(call(aten.index_put.default, x, [idx], v)) is None
        mask = meta(8, dtype=torch.bool)
        assert "boolean" in op_support.unsupported_reason(call(aten.index_put.default, x, [mask], v))

    def test_accumulating_scatters_only_in_the_moe_combine_form_or_as_float_sums(self):
        x, idx, v = meta(8, 4), meta(8, dtype=torch.int64), meta(8, 4)
        assert op_support.unsupported_reason(call(aten.index_put.default, x, [idx], v, True)) is None
        x, v = meta(8, 4, dtype=torch.int32), meta(8, 4, dtype=torch.int32)
        reason = op_support.unsupported_reason(call(aten.index_put.default, x, [idx], v, True))
        assert "float MatMul" in reason
        reason = op_support.unsupported_reason(call(aten.scatter_add.default, x, 0, meta(8, 4, dtype=torch.int64), v))
        assert "no accumulating scatter" in reason

    def test_scatter_reduce_is_refused(self):
        x, idx = meta(8, 4, dtype=torch.float32), meta(8, 4, dtype=torch.int64)
        assert "reducing scatter" in op_support.unsupported_reason(call(aten.scatter_reduce.two, x, 0, idx, x, "sum"))


def test_boolean_mask_indexing_is_refused():
    reason = op_support.unsupported_reason(call(aten.index.Tensor, meta(8, 4), [meta(8, dtype=torch.bool)]))
    assert "data-dependent" in reason
    assert op_support.unsupported_reason(call(aten.index.Tensor, meta(8, 4), [meta(5, dtype=torch.int64)])) is None


def test_split_sizes_must_be_static():
    assert op_support.unsupported_reason(call(aten.split_with_sizes_copy.default, meta(8, 4), [2, 2], 1)) is None


def test_cast_needs_contiguous_dim_order():
    to_dim_order = torch.ops.dim_order_ops._to_dim_order_copy.default
    node = call(to_dim_order, meta(2, 3), dtype=torch.float32, dim_order=[1, 0], out=meta(2, 3, dtype=torch.float32))
    assert "dim_order" in op_support.unsupported_reason(node)


class _RouterIds(torch.nn.Module):
    """Expert ids over 8 experts reaching an argsort through value-preserving ops, PhiMoE's "sparse
    mixer" style (two max results concatenated) or otherwise."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, scores, perm, other):
        _, first = scores.max(-1, keepdim=True)
        _, second = scores.scatter(-1, first, float("-inf")).max(-1, keepdim=True)
        ids = torch.cat([first, second], dim=-1)  # [T, 2]
        flat = {
            "cat": lambda: ids.reshape(-1),
            "cat-topk": lambda: torch.cat([ids, scores.topk(2, dim=-1).indices], dim=-1).reshape(-1),
            "gather": lambda: ids.reshape(-1)[perm],
            "index_select": lambda: ids.reshape(-1).index_select(0, perm),
            "take_along": lambda: ids.gather(1, perm.reshape(-1, 2) % 2).reshape(-1),
            "int32": lambda: ids.to(torch.int32).reshape(-1),
            "float32-int": lambda: ids.float().long().reshape(-1),
            "bf16": lambda: ids.to(torch.bfloat16).long().reshape(-1),
            "cat-other": lambda: torch.cat([ids, other], dim=-1).reshape(-1),
        }[self.path]()
        return torch.argsort(flat, stable=True)


@pytest.mark.parametrize(("path", "bound"), [
    ("cat", 8), ("cat-topk", 8), ("gather", 8), ("index_select", 8), ("take_along", 8), ("int32", 8),
    ("float32-int", 8), ("bf16", None), ("cat-other", None),
])
def test_expert_ids_through_value_preserving_ops(path, bound):
    """Ids keep their bound (the expert count) through concatenation, gathers, reshapes and exact
    casts, so their sort has no length limit; a bf16 round trip or an unknown part loses it."""
    tokens = 3000  # 6000 ids: beyond TensorRT's TopK limit, only a counting sort can sort them
    args = (torch.randn(tokens, 8), torch.randperm(2 * tokens), torch.randint(0, 8, (tokens, 2)))
    exported = torch.export.export(_RouterIds(path), args)
    for program in (exported, exported.run_decompositions({})):  # as exported, and as the lowering sees it
        (sort,) = [n for n in program.graph.nodes if n.target is aten.argsort.stable]
        assert routing.integer_key_bound(sort.args[0]) == bound
        reason = op_support.unsupported_reason(sort)
        assert (reason is None) == (bound is not None), reason
