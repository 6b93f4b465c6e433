"""ONNX translations (onnxscript) of the ops the rewrites produce, and of the
ATen ops whose torchlib form TensorRT would refuse (integer cumsum, unsorted
topk, slice_scatter's ScatterND), gets wrong (copy without its broadcast) or cannot
export (amax / amin over every axis). Everything else goes through torchlib, the ONNX exporter's own table.

Every form here is built from ops TensorRT's ONNX parser takes, in the dtypes
it takes them (its support matrix: CumSum only in FP32/FP16/BF16, ScatterND /
ScatterElements only without reduction, TopK K static and at most
tensorrt_limits.TOPK_MAX_K).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnxscript import ir
from onnxscript import opset18 as op
from onnxscript import values
from onnxscript.function_libs.torch_lib.ops import core as torchlib

from et_trt_backend.plugin_names import (
    ACTIVATION_ATTRIBUTE,
    ACTIVATIONS,
    FP8_WEIGHT_ONNX_TYPE,
    GROUPED_MM_DOMAIN,
    GROUPED_MM_OP,
    INT4_GROUP_SIZE_ATTRIBUTE,
    INT4_WEIGHT_ONNX_TYPE,
    MOE_ACTIVATION_ATTRIBUTE,
    MOE_ACTIVATIONS,
    MOE_ALPHA_ATTRIBUTE,
    MOE_EXPERTS_OP,
    MOE_LAYOUT_ATTRIBUTE,
    MOE_LIMIT_ATTRIBUTE,
    PLUGIN_ATTRIBUTES,
)

from . import ops as _ops  # noqa: F401  (registers torch.ops.et_trt_lowering)

ONNX_OPSET = op.version  # the opset of the ops written here, and of the exported model
_GROUPED_MM_DOMAIN_VERSION = 1  # the opset version of GROUPED_MM_DOMAIN, in which GroupedMM is defined
KERNEL_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# The torch dtype the lowering stores an FP8 GroupedMM's weights in (fp8_experts.py): the one that the ONNX
# type plugin_names.FP8_WEIGHT_ONNX_TYPE (the one place deciding it) is written from.
FP8_WEIGHTS_TORCH_DTYPE = {"FLOAT8E4M3FN": torch.float8_e4m3fn, "INT8": torch.int8}[FP8_WEIGHT_ONNX_TYPE]
# Likewise the packed INT4 weights' (int4_experts.py), from plugin_names.INT4_WEIGHT_ONNX_TYPE.
INT4_WEIGHTS_TORCH_DTYPE = {"UINT8": torch.uint8, "INT8": torch.int8}[INT4_WEIGHT_ONNX_TYPE]


def _register_grouped_mm_schema() -> None:
    if onnx.defs.has(GROUPED_MM_OP, GROUPED_MM_DOMAIN):
        return
    types = ["tensor(bfloat16)", "tensor(float16)"]
    weight_types = [*types, f"tensor({FP8_WEIGHT_ONNX_TYPE.lower()})", f"tensor({INT4_WEIGHT_ONNX_TYPE.lower()})"]
    schema = onnx.defs.OpSchema(
        GROUPED_MM_OP, GROUPED_MM_DOMAIN, _GROUPED_MM_DOMAIN_VERSION,
        doc="Grouped GEMM of et-trt (contract 4): rows [start_g, end_g) = a @ b[g], uncovered rows zero. With "
            f"b_scale, the FP8 form: b is e4m3 [G, N, K] ({FP8_WEIGHT_ONNX_TYPE}, trans_b = 1), "
            "b[g, n, :] scaled by b_scale[g, n], a quantized per row at run time (et_trt_backend/quantization.py). "
            f"With {INT4_GROUP_SIZE_ATTRIBUTE} > 0, the INT4 form: b is packed INT4 ({INT4_WEIGHT_ONNX_TYPE} "
            "[G, N, round_up(K, 32) / 2], trans_b = 1) with bfloat16 b_scale [G, N, ceil(K / group_size)] "
            "(et_trt_backend/int4_weights.py).",
        inputs=[
            onnx.defs.OpSchema.FormalParameter("a", "T"),
            onnx.defs.OpSchema.FormalParameter("b", "TB"),
            onnx.defs.OpSchema.FormalParameter("offs", "tensor(int32)"),
            onnx.defs.OpSchema.FormalParameter("b_scale", "TS",
                                               param_option=onnx.defs.OpSchema.FormalParameterOption.Optional),
        ],
        outputs=[onnx.defs.OpSchema.FormalParameter("out", "T")],
        type_constraints=[("T", types, "bf16 or fp16"),
                          ("TB", weight_types, "a's type, or the FP8 or INT4 weights with b_scale"),
                          ("TS", ["tensor(float)", "tensor(bfloat16)"], "FP8: float32 scales; INT4: bfloat16")],
        attributes=[
            onnx.defs.OpSchema.Attribute("trans_b", onnx.defs.OpSchema.AttrType.INT, "1: b is [G, N, K]"),
            onnx.defs.OpSchema.Attribute(ACTIVATION_ATTRIBUTE, onnx.defs.OpSchema.AttrType.INT,
                                         "FP8 form: 1 where a is a gate+up output [rows, 2K] and the GEMM takes "
                                         "its SwiGLU silu(a[:, :K]) * a[:, K:]; 0: a itself (the default, which "
                                         "blobs written before the attribute omit)",
                                         required=False),
            onnx.defs.OpSchema.Attribute(INT4_GROUP_SIZE_ATTRIBUTE, onnx.defs.OpSchema.AttrType.INT,
                                         "INT4 form: the scale groups' size along K (32, 64, 128); 0 otherwise (the "
                                         "default, which blobs written before the attribute omit)", required=False),
            *(onnx.defs.OpSchema.Attribute(name, onnx.defs.OpSchema.AttrType.STRING, "")
              for name in PLUGIN_ATTRIBUTES),
        ],
    )
    onnx.defs.register_schema(schema)


def _register_moe_experts_schema() -> None:
    if onnx.defs.has(MOE_EXPERTS_OP, GROUPED_MM_DOMAIN):
        return
    param = onnx.defs.OpSchema.FormalParameter
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    attribute = onnx.defs.OpSchema.Attribute
    kind = onnx.defs.OpSchema.AttrType
    schema = onnx.defs.OpSchema(
        MOE_EXPERTS_OP, GROUPED_MM_DOMAIN, _GROUPED_MM_DOMAIN_VERSION,
        doc="The fused MoE experts of et-trt (issue 32, et_trt_backend/moe_experts.py): out[t] = sum over j of "
            "topk_weights[t, j] * down_e(act(gate_up_e(hidden[t]))), e = topk_ids[t, j]; weights as [E, out, in]. "
            f"With {INT4_GROUP_SIZE_ATTRIBUTE} > 0, w_gate_up and w_down are packed INT4 ({INT4_WEIGHT_ONNX_TYPE}) "
            "with bfloat16 group scales w_gate_up_scale and w_down_scale (et_trt_backend/int4_weights.py). With the "
            f"scales and {INT4_GROUP_SIZE_ATTRIBUTE} 0, they are e4m3 ({FP8_WEIGHT_ONNX_TYPE}) with float32 scales "
            "per output channel [E, out] (et_trt_backend/moe_experts_fp8.py).",
        inputs=[
            param("hidden", "T"),
            param("topk_ids", "tensor(int32)"),
            param("topk_weights", "TW"),
            param("w_gate_up", "TQ"),
            param("w_down", "TQ"),
            param("b_gate_up", "T", param_option=optional),
            param("b_down", "T", param_option=optional),
            param("w_gate_up_scale", "TS", param_option=optional),
            param("w_down_scale", "TS", param_option=optional),
        ],
        outputs=[param("out", "T")],
        type_constraints=[("T", ["tensor(bfloat16)", "tensor(float16)"], "bf16 or fp16"),
                          ("TW", ["tensor(float)", "tensor(bfloat16)", "tensor(float16)"], "float32 or hidden's"),
                          ("TQ", ["tensor(bfloat16)", "tensor(float16)", f"tensor({INT4_WEIGHT_ONNX_TYPE.lower()})",
                                  f"tensor({FP8_WEIGHT_ONNX_TYPE.lower()})"], "hidden's type, packed INT4 or FP8"),
                          ("TS", ["tensor(bfloat16)", "tensor(float)"], "INT4: bfloat16 scales; FP8: float32")],
        attributes=[
            attribute(MOE_ACTIVATION_ATTRIBUTE, kind.INT, "plugin_names.MOE_ACTIVATIONS"),
            attribute(MOE_LAYOUT_ATTRIBUTE, kind.STRING, "plugin_names.MOE_GATE_UP_LAYOUTS"),
            attribute(MOE_ALPHA_ATTRIBUTE, kind.FLOAT, "gptoss_glu's alpha"),
            attribute(MOE_LIMIT_ATTRIBUTE, kind.FLOAT, "gptoss_glu's limit"),
            attribute(INT4_GROUP_SIZE_ATTRIBUTE, kind.INT, "INT4 weights: the scale groups' size; 0 otherwise",
                      required=False),
            *(attribute(name, kind.STRING, "") for name in PLUGIN_ATTRIBUTES),
        ],
    )
    onnx.defs.register_schema(schema)


_register_grouped_mm_schema()
_register_moe_experts_schema()
et_trt = values.Opset(GROUPED_MM_DOMAIN, _GROUPED_MM_DOMAIN_VERSION)


# Every plugin field an ONNX node supplies is written, defaults too: TensorRT's parser warns about each field
# of the plugin creator that a node lacks ("Attribute activation not found in plugin node!").
def grouped_mm_kernel(a, b, offs, trans_b: bool):
    """`_grouped_mm` as the GroupedMM custom op (the plugin runs the embedded kernel)."""
    return et_trt.GroupedMM(a, b, offs, trans_b=int(trans_b), **{ACTIVATION_ATTRIBUTE: ACTIVATIONS["none"]},
                            **{INT4_GROUP_SIZE_ATTRIBUTE: 0}, **PLUGIN_ATTRIBUTES)


def grouped_mm_fp8_kernel(a, b_q, offs, b_scale, activation: int = ACTIVATIONS["none"]):
    """The FP8 GroupedMM (lowering op grouped_mm_fp8) as the 4-input GroupedMM custom op."""
    return et_trt.GroupedMM(a, b_q, offs, b_scale, trans_b=1, **{ACTIVATION_ATTRIBUTE: activation},
                            **{INT4_GROUP_SIZE_ATTRIBUTE: 0}, **PLUGIN_ATTRIBUTES)


def grouped_mm_int4_kernel(a, b_packed, offs, b_scale, group_size: int):
    """The INT4 GroupedMM (lowering op grouped_mm_int4) as the 4-input GroupedMM custom op with its group size."""
    return et_trt.GroupedMM(a, b_packed, offs, b_scale, trans_b=1, **{ACTIVATION_ATTRIBUTE: ACTIVATIONS["none"]},
                            **{INT4_GROUP_SIZE_ATTRIBUTE: group_size}, **PLUGIN_ATTRIBUTES)


def _moe_attributes(activation: str, gate_up_layout: str, alpha: float, limit: float, group_size: int) -> dict:
    return {MOE_ACTIVATION_ATTRIBUTE: MOE_ACTIVATIONS[activation], MOE_LAYOUT_ATTRIBUTE: gate_up_layout,
            MOE_ALPHA_ATTRIBUTE: float(alpha), MOE_LIMIT_ATTRIBUTE: float(limit),
            INT4_GROUP_SIZE_ATTRIBUTE: group_size, **PLUGIN_ATTRIBUTES}


def moe_experts_kernel(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up=None, b_down=None,
                       activation: str = "swiglu", gate_up_layout: str = "concat", alpha: float = 1.702,
                       limit: float = 7.0):
    """The lowering op moe_experts as the MoEExperts custom op, every attribute written. Absent trailing
    biases are left out (ONNX's optional inputs); the lowering never leaves out b_gate_up alone."""
    if b_gate_up is None and b_down is not None:
        raise ValueError("moe_experts with b_down but no b_gate_up: the lowering writes zeros for the missing one")
    biases = [bias for bias in (b_gate_up, b_down) if bias is not None]
    return et_trt.MoEExperts(hidden, topk_ids, topk_weights, w_gate_up, w_down, *biases,
                             **_moe_attributes(activation, gate_up_layout, alpha, limit, 0))


def moe_experts_int4_kernel(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                            w_down_scale, activation: str, gate_up_layout: str, alpha: float, limit: float,
                            group_size: int):
    """The lowering op moe_experts_int4 as the MoEExperts custom op: packed weights, both biases (int4_experts.py
    writes zeros for a missing one), the two scale inputs, and the group size."""
    return et_trt.MoEExperts(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                             w_down_scale, **_moe_attributes(activation, gate_up_layout, alpha, limit, group_size))


def moe_experts_fp8_kernel(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                           w_down_scale, activation: str, gate_up_layout: str, alpha: float, limit: float):
    """The lowering op moe_experts_fp8 as the MoEExperts custom op: e4m3 weights, both biases (fp8_experts.py writes
    zeros for a missing one), the two float32 scale inputs, group size 0."""
    return et_trt.MoEExperts(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale,
                             w_down_scale, **_moe_attributes(activation, gate_up_layout, alpha, limit, 0))


def grouped_mm_dense(a, b, offs, trans_b: bool):
    """`_grouped_mm` in TensorRT-native ops: every row times every group's weights, masked.

    Costs G times the multiply-adds of the grouped form and a [G, rows, N]
    intermediate; used when the kernel is off or for fp32. Same semantics as
    GroupedMM for any offs: end_g = running max of clip(offs, 0, rows).
    """
    groups = b.shape[0]
    weights = op.Transpose(b, perm=[0, 2, 1]) if trans_b else b
    rows = op.Shape(a, start=0, end=1)
    # Clamp to [0, rows] with Where: TensorRT's Clip (what Min/Max fold into) takes no integers.
    ends = op.Cast(offs, to=onnx.TensorProto.INT64)
    zero = op.Constant(value_int=0)
    ends = op.Where(op.Less(ends, zero), zero, ends)
    ends = op.Where(op.Less(rows, ends), rows, ends)
    # Running max over groups via a constant lower-triangular [G, G] mask.
    lower = op.Constant(value=ir.tensor(np.tril(np.ones((groups, groups), dtype=bool))))
    ends = op.ReduceMax(op.Where(lower, op.Unsqueeze(ends, [0]), op.Constant(value_int=0)), [1], keepdims=0)
    starts = op.Concat(op.Constant(value_ints=[0]), op.Slice(ends, [0], [groups - 1]), axis=0)
    row_ids = op.Range(op.Constant(value_int=0), op.Squeeze(rows, [0]), op.Constant(value_int=1))
    row_ids = op.Unsqueeze(row_ids, [0])  # [1, rows]
    in_group = op.And(
        op.GreaterOrEqual(row_ids, op.Unsqueeze(starts, [1])), op.Less(row_ids, op.Unsqueeze(ends, [1]))
    )  # [G, rows]
    products = op.MatMul(op.Unsqueeze(a, [0]), weights)  # [G, rows, N]
    masked = op.Where(op.Unsqueeze(in_group, [2]), products, op.CastLike(op.Constant(value_float=0.0), a))
    return op.ReduceSum(masked, [0], keepdims=0)


def counting_sort(ids, num_bins: int, row_width: int):
    """Stable ascending sort of ids in [0, num_bins): (values, indices), as a counting sort.

    Each id's destination is start[bin] + its rank among earlier rows of the
    same bin; start is the exclusive cumsum of the bin counts, and the ranks
    come from a cumsum over rows of a [rows, bins] indicator. dest is a
    permutation, so scattering row numbers to it (ScatterElements without
    reduction) yields the sort's indices. Counts run in float32 (TensorRT's
    CumSum takes no integers), exact below 2^24 rows.

    With row_width k > 1 the ids are [T, k] rows of distinct values (top-k
    expert ids, flattened). An expert then appears at most once per token, so
    an id's rank is the number of earlier tokens that chose its expert: the
    indicator is [T, E] (a scatter of ones, no reduction), k times smaller
    than the [T*k, E] one-hot of the general form.

    Memory at 70,000 rows and 128 bins, computed from the ONNX graph by
    tests/test_lowering_routing.py::test_counting_sort_memory_at_70000_rows_and_128_experts
    (sizes of every tensor computed from the ids, after shape inference,
    nothing freed or fused). Top-k ids, 8,750 tokens x k = 8: the [T, E]
    float32 zeros, indicator and cumsum are 4.48 MB each (indicator and cumsum
    live together: 8.96 MB peak), everything else O(T*k + E), 2.24 MB:
    15.68 MB in all. The general form (row_width 1): one-hot and cumsum
    [N, E] float32 35.84 MB each (71.68 MB peak), the bool compare 8.96 MB,
    the rest 2.80 MB: 83.44 MB. Expert counts (histc / bincount of the same
    ids, bounded_bincount) use the same [T, E] indicator. For scale, the routed
    rows themselves at hidden size 3072 in bf16 are 430 MB.
    """
    ids = op.Cast(ids, to=onnx.TensorProto.INT64)
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    indicator, columns = _bin_indicator(ids, num_bins, row_width)
    earlier = op.CumSum(indicator, zero, exclusive=1)  # earlier rows (tokens) per bin
    rank = op.Reshape(op.GatherElements(earlier, columns, axis=1), op.Constant(value_ints=[-1]))
    starts = op.CumSum(op.ReduceSum(indicator, [0], keepdims=0), zero, exclusive=1)
    dest = op.Cast(op.Add(op.Gather(starts, ids), rank), to=onnx.TensorProto.INT64)
    positions = op.Range(zero, op.Squeeze(op.Shape(ids), [0]), one)
    indices = op.ScatterElements(positions, dest, positions, axis=0)  # data is overwritten everywhere
    return op.Gather(ids, indices), indices


def _bin_indicator(ids, num_bins: int, row_width: int):
    """(indicator, columns): float32 1 where a row holds a bin, and each id's column in it.

    row_width 1: [N, E] one-hot of the ids, columns [N, 1]. row_width k: ids are
    [T, k] rows of distinct values; [T, E] with the k ones of each row scattered
    in (no reduction needed: they are distinct), columns [T, k].
    """
    if row_width > 1:
        columns = op.Reshape(ids, op.Constant(value_ints=[-1, row_width]))  # [T, k]
        shape = op.Concat(op.Shape(columns, start=0, end=1), op.Constant(value_ints=[num_bins]), axis=0)
        indicator = op.ScatterElements(
            op.Expand(op.Constant(value_float=0.0), shape),
            columns, op.Expand(op.Constant(value_float=1.0), op.Shape(columns)), axis=1)
        return indicator, columns
    bins = op.Constant(value=ir.tensor(np.arange(num_bins, dtype=np.int64)))
    columns = op.Unsqueeze(ids, [1])  # [N, 1]
    return op.Cast(op.Equal(columns, bins), to=onnx.TensorProto.FLOAT), columns


def bounded_bincount(ids, num_bins: int, row_width: int):
    """bincount of ids in [0, num_bins) with a static size: the bin indicator summed over rows
    (float32, exact below 2^24 rows), as int64."""
    indicator, _ = _bin_indicator(op.Cast(ids, to=onnx.TensorProto.INT64), num_bins, row_width)
    return op.Cast(op.ReduceSum(indicator, [0], keepdims=0), to=onnx.TensorProto.INT64)


def cumsum(self, dim: int, dtype: int = -1):
    """aten.cumsum: integer (and bool) sums run in float32 (TensorRT's CumSum takes no integers).

    Exact while partial sums stay below 2^24 (routing counts: rows per expert).
    Without a dtype, integer and bool inputs sum to int64, as in PyTorch.
    """
    if dtype != -1:
        out_type = ir.DataType(dtype)
    else:
        out_type = self.dtype if self.dtype.is_floating_point() else ir.DataType.INT64
    if out_type.is_floating_point():
        return op.CumSum(op.Cast(self, to=out_type), op.Constant(value_int=dim))
    summed = op.CumSum(op.Cast(self, to=onnx.TensorProto.FLOAT), op.Constant(value_int=dim))
    return op.Cast(summed, to=out_type)


def _reduce_over(reduce, self, dim, keepdim: bool):
    """`reduce` (ReduceMax, ReduceMin) over `dim`, or every axis where dim is empty."""
    axes = [op.Constant(value_ints=list(dim))] if dim else []
    return reduce(self, *axes, keepdims=int(keepdim))


def amax(self, dim=(), keepdim: bool = False):
    """aten.amax: over `dim`, or every axis where dim is empty (its default; torchlib's form requires one)."""
    return _reduce_over(op.ReduceMax, self, dim, keepdim)


def amin(self, dim=(), keepdim: bool = False):
    """aten.amin: as amax."""
    return _reduce_over(op.ReduceMin, self, dim, keepdim)


def copy(self, src, non_blocking: bool = False):
    """aten.copy: src broadcast to self's shape, in self's dtype (torchlib's form omits the broadcast)."""
    return op.Expand(op.CastLike(src, self), op.Shape(self))


def _index_1d(value, default: int):
    """A slice bound (None, an int or a SymInt's tensor) as the 1-D int64 tensor Slice takes."""
    if value is None:
        return op.Constant(value_ints=[default])
    if isinstance(value, int):
        return op.Constant(value_ints=[value])
    return op.Reshape(op.Cast(value, to=onnx.TensorProto.INT64), op.Constant(value_ints=[-1]))


def slice_scatter(self, src, dim: int = 0, start=None, end=None, step: int = 1):
    """aten.slice_scatter without a scatter (whose torchlib form TensorRT's parser refuses). Step 1: self
    before the slice, src, self after it, concatenated (Slice + Concat); other steps: _strided_slice_scatter."""
    if step != 1:
        return _strided_slice_scatter(self, src, dim, start, step)
    axis = op.Constant(value_ints=[dim])
    int64_max = 2**63 - 1
    before = op.Slice(self, op.Constant(value_ints=[0]), _index_1d(start, 0), axis)
    after = op.Slice(self, _index_1d(end, int64_max), op.Constant(value_ints=[int64_max]), axis)
    return op.Concat(before, src, after, axis=dim)


def _strided_slice_scatter(self, src, dim: int, start, step: int):
    """slice_scatter with step > 1: position i along dim takes src[(i - first) / step] where i - first is a
    non-negative multiple of step below step * len(src), else keeps self[i] (Gather + Where). first is the
    slice's start as aten.slice reads it (negative from the end, clamped at 0); src's length already holds
    the end. src gets one more element along dim (a copy of self's first, never selected), which every
    position that is not written gathers: no index is ever out of bounds, an empty src included."""
    rank = len(self.shape)
    dim = dim % rank
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    size = op.Shape(self, start=dim, end=dim + 1)
    length = op.Shape(src, start=dim, end=dim + 1)
    first = _index_1d(start, 0)
    if not (start is None or isinstance(start, int) and start >= 0):
        first = op.Where(op.Less(first, zero), op.Add(first, size), first)
        first = op.Where(op.Less(first, zero), zero, first)
    offset = op.Sub(op.Range(zero, op.Squeeze(size, [0]), one), first)  # [size]
    ahead = op.Where(op.Less(offset, zero), zero, offset)
    index = op.Div(ahead, op.Constant(value_int=step))  # non-negative: integer division floors
    written = op.And(op.And(op.GreaterOrEqual(offset, zero), op.Equal(op.Mul(index, op.Constant(value_int=step)),
                                                                       ahead)),
                     op.Less(index, length))
    spare = op.Slice(self, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[dim]))
    padded = op.Concat(op.CastLike(src, self), spare, axis=dim)
    gathered = op.Gather(padded, op.Where(written, index, op.Squeeze(length, [0])), axis=dim)
    along_dim = op.Constant(value_ints=[-1 if d == dim else 1 for d in range(rank)])
    return op.Where(op.Reshape(written, along_dim), gathered, self)


def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """aten.topk as a TopK that always sorts: TensorRT supports only sorted=1, and sorted results
    are a valid answer to sorted=False (whose order is unspecified)."""
    return op.TopK(self, op.Constant(value_ints=[k]), axis=dim, largest=int(largest), sorted=1)


def _shaped_like(value, original):
    """`value` with `original`'s shape recorded: torchlib's functions read their inputs' ranks."""
    value.shape = original.shape
    return value


def convolution(input, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), transposed: bool = False,
                output_padding=(0,), groups: int = 1):
    """aten.convolution as torchlib writes it (Conv, ConvTranspose), except a bf16 transposed one: NVIDIA's
    builder builds no bf16 deconvolution (TensorRT for RTX 1.7, for sm_80: any stride, groups, padding or
    rank), so it runs in float32 between two casts."""
    if not (transposed and input.dtype == ir.DataType.BFLOAT16):
        return torchlib.aten_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                         groups)
    as_float = lambda v: None if v is None else _shaped_like(op.Cast(v, to=onnx.TensorProto.FLOAT), v)  # noqa: E731
    out = torchlib.aten_convolution(as_float(input), as_float(weight), as_float(bias), stride, padding, dilation,
                                    transposed, output_padding, groups)
    return op.Cast(out, to=onnx.TensorProto.BFLOAT16)


def _from_the_end(index, size):
    """Indices into an axis of `size` elements with negatives counted from its end, as PyTorch reads them."""
    normalized = op.Cast(index, to=onnx.TensorProto.INT64)
    normalized = op.Where(op.Less(normalized, op.Constant(value_int=0)), op.Add(normalized, size), normalized)
    return _shaped_like(normalized, index)


def index_put(self, indices, values, accumulate: bool = False):
    """aten.index_put on any dimensions (x[:, idx] = v), negative indices counted from the end.

    Without accumulate: torchlib's form (transposes around one ScatterND without reduction). With it
    (op_support admits one 1-D index, float values): TensorRT has no accumulating scatter, so the
    values are summed into their rows by a MatMul with the [K, N] one-hot of the index, which adds
    duplicates as index_put does: K x N multiply-adds per element of the other dimensions.
    """
    shape = op.Shape(self)
    indices = [None if index is None else _from_the_end(index, op.Gather(shape, op.Constant(value_int=axis)))
               for axis, index in enumerate(indices)]
    if not accumulate:
        return torchlib.aten_index_put(self, indices, values, False)
    (axis, index), = [(axis, index) for axis, index in enumerate(indices) if index is not None]
    rank = len(self.shape)
    indexed = op.Concat(op.Shape(self, start=0, end=axis), op.Shape(index), op.Shape(self, start=axis + 1), axis=0)
    to_last = [d for d in range(rank) if d != axis] + [axis]
    rows = op.Transpose(op.Expand(op.CastLike(values, self), indexed), perm=to_last)  # [..., K]
    positions = op.Range(op.Constant(value_int=0), op.Gather(shape, op.Constant(value_int=axis)),
                         op.Constant(value_int=1))
    one_hot = op.CastLike(op.Equal(op.Unsqueeze(index, [1]), op.Unsqueeze(positions, [0])), self)  # [K, N]
    sums = op.MatMul(rows, one_hot)  # [..., N]
    return op.Add(self, op.Transpose(sums, perm=[to_last.index(d) for d in range(rank)]))


def bucketize(self, boundaries, out_int32: bool = False, right: bool = False):
    """aten.bucketize: how many boundaries lie below each value (at or below it with right=True), compared in
    one dtype (float32 where the two differ and either is floating, else int64), NaN past the last one as
    in PyTorch. A [..., len(boundaries)] comparison, summed."""
    if self.dtype != boundaries.dtype:
        common = (onnx.TensorProto.FLOAT if self.dtype.is_floating_point() or boundaries.dtype.is_floating_point()
                  else onnx.TensorProto.INT64)
        self, boundaries = op.Cast(self, to=common), op.Cast(boundaries, to=common)
    values = op.Unsqueeze(self, [-1])
    below = op.LessOrEqual(boundaries, values) if right else op.Less(boundaries, values)
    count = op.ReduceSum(op.Cast(below, to=onnx.TensorProto.INT64), [-1], keepdims=0)
    if self.dtype.is_floating_point():
        count = op.Where(op.IsNaN(self), op.Size(boundaries), count)
    return op.Cast(count, to=onnx.TensorProto.INT32 if out_int32 else onnx.TensorProto.INT64)


def translation_table(grouped_gemm_kernel: bool) -> dict:
    """custom_translation_table for torch.onnx.export."""

    def grouped_mm(a, b, offs, trans_b: bool):
        if grouped_gemm_kernel and a.dtype in (ir.DataType.BFLOAT16, ir.DataType.FLOAT16):
            return grouped_mm_kernel(a, b, offs, trans_b)
        return grouped_mm_dense(a, b, offs, trans_b)

    lowering_ops = torch.ops.et_trt_lowering
    return {
        lowering_ops.grouped_mm.default: grouped_mm,
        lowering_ops.grouped_mm_fp8.default: grouped_mm_fp8_kernel,
        lowering_ops.grouped_mm_int4.default: grouped_mm_int4_kernel,
        lowering_ops.moe_experts.default: moe_experts_kernel,
        lowering_ops.moe_experts_int4.default: moe_experts_int4_kernel,
        lowering_ops.moe_experts_fp8.default: moe_experts_fp8_kernel,
        lowering_ops.counting_sort.default: counting_sort,
        lowering_ops.bounded_bincount.default: bounded_bincount,
        torch.ops.aten.cumsum.default: cumsum,
        torch.ops.aten.amax.default: amax,
        torch.ops.aten.amin.default: amin,
        torch.ops.aten.topk.default: topk,
        torch.ops.aten.copy.default: copy,
        torch.ops.aten.slice_scatter.default: slice_scatter,
        torch.ops.aten.convolution.default: convolution,
        torch.ops.aten.index_put.default: index_put,
        torch.ops.aten.bucketize.Tensor: bucketize,
    }
