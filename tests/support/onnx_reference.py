"""Test helper: runs a partition's ONNX on the CPU without TensorRT, to check it numerically.

onnx's ReferenceEvaluator runs every standard op; `GroupedMM` gets the
implementation below, which follows contract 4 exactly (clamped offsets,
uncovered rows zero, float32 accumulation), its FP8 form (a 4th input b_scale)
too (with activation 1, of a gate+up output's SwiGLU): written here with numpy and ml_dtypes' e4m3, independently of
et_trt_backend.quantization, so the two check each other; likewise its INT4 form (group_size > 0: packed weights
unpacked here, independently of et_trt_backend.int4_weights), and MoEExperts' INT4 and FP8 forms (e4m3 weights with
float32 scales per output channel; the GEMMs' inputs quantized as et_trt_backend.moe_experts_fp8 says).
`MoEExperts` (issue 32) gets one written from its
definition in float64 with numpy, independently of et_trt_backend.moe_experts, rounding where the definition
rounds (a no-op in a float32 twin). `to_float32` makes a float32 twin
of a bf16/fp16 model, so it can be compared with the PyTorch partition run in
float32 (numpy and the reference evaluator have no bf16 arithmetic).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from et_trt_backend.plugin_names import (
    GROUPED_MM_DOMAIN,
    GROUPED_MM_OP,
    MOE_ACTIVATIONS,
    MOE_EXPERTS_OP,
    MOE_GATED_ACTIVATIONS,
)

_LOW_PRECISION = (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16)


def grouped_mm_reference(a: np.ndarray, b: np.ndarray, offs: np.ndarray, trans_b: int) -> np.ndarray:
    """Contract 4: rows [start_g, end_g) = a @ b[g], end_g = clamp(offs[g], start_g, rows)."""
    rows = a.shape[0]
    weights = np.swapaxes(b, 1, 2) if trans_b else b
    out = np.zeros((rows, weights.shape[2]), dtype=a.dtype)
    start = 0
    for g in range(weights.shape[0]):
        end = min(max(int(offs[g]), start), rows)
        out[start:end] = (a[start:end].astype(np.float32) @ weights[g].astype(np.float32)).astype(a.dtype)
        start = end
    return out


FP8_MAX = 448.0


def quantize_rows_fp8(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 values as float32, float32 scales) per row of a's last axis: scale = amax / 448 (1 where 0),
    values rounded to nearest even after saturating to +-448 (ml_dtypes' cast makes NaN beyond 464)."""
    a = a.astype(np.float32)
    amax = np.abs(a).max(axis=-1)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
    scaled = np.clip(a / scale[..., None], -FP8_MAX, FP8_MAX)
    return scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float32), scale


def grouped_mm_fp8_reference(a: np.ndarray, b: np.ndarray, offs: np.ndarray, b_scale: np.ndarray) -> np.ndarray:
    """The FP8 GroupedMM: a quantized per row, times e4m3 b [G, N, K] (int8 bits or float8) scaled per
    [g, n] by b_scale, float64 sums of the exact products; out in a's dtype, groups as contract 4."""
    weights = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    a_q, a_scale = quantize_rows_fp8(a)
    rows = a.shape[0]
    out = np.zeros((rows, weights.shape[1]), dtype=a.dtype)
    start = 0
    for g in range(weights.shape[0]):
        end = min(max(int(offs[g]), start), rows)
        sums = (a_q[start:end].astype(np.float64) @ weights[g].T).astype(np.float32)
        out[start:end] = (sums * a_scale[start:end, None] * b_scale[g]).astype(a.dtype)
        start = end
    return out


def swiglu(x: np.ndarray) -> np.ndarray:
    """silu(x[:, :K]) * x[:, K:] of a gate+up output [rows, 2K] (GroupedMM's activation 1), in x's dtype."""
    gate, up = np.split(x.astype(np.float32), 2, axis=1)
    return (gate / (1 + np.exp(-gate)) * up).astype(x.dtype)


def int4_dequantized(packed: np.ndarray, scales: np.ndarray, k: int, group_size: int) -> np.ndarray:
    """float64 weights [G, N, K] of packed INT4 bytes [G, N, Kp / 2]: each 16-byte chunk c of a row holds elements
    32c + j (low nibbles) and 32c + 16 + j (high nibbles), stored as q + 8; times each group's scale."""
    chunks = packed.view(np.uint8).reshape(*packed.shape[:-1], -1, 16).astype(np.int64)
    q = np.concatenate([chunks & 0xF, chunks >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :k] - 8
    return q * np.repeat(scales.astype(np.float64), group_size, axis=-1)[..., :k]


class GroupedMM(OpRun):
    op_domain = GROUPED_MM_DOMAIN

    def _run(self, a, b, offs, b_scale=None, trans_b=0, activation=0, group_size=0, plugin_version=None,
             plugin_namespace=None):
        if group_size:
            assert trans_b == 1 and activation == 0, "the INT4 GroupedMM takes b as [G, N, K] and a itself"
            weights = int4_dequantized(b, b_scale, a.shape[1], group_size).astype(np.float32)
            return (grouped_mm_reference(a, weights, offs, 1),)
        if b_scale is not None:
            assert trans_b == 1, "the FP8 GroupedMM takes b as [G, N, K] only"
            assert activation in (0, 1), f"activation {activation}"
            return (grouped_mm_fp8_reference(swiglu(a) if activation == 1 else a, b, offs, b_scale),)
        assert activation == 0, "activation is the FP8 form's only"
        return (grouped_mm_reference(a, b, offs, trans_b),)


assert GroupedMM.__name__ == GROUPED_MM_OP


def _moe_activation(y: np.ndarray, activation: str, layout: str, alpha: float, limit: float) -> np.ndarray:
    """An MoEExperts activation of gate+up rows y [rows, N1] (float64): gated ones read feature f's gate row
    (f // B) * 2B + f % B and its up row that + B, B the layout's block."""
    erf = np.vectorize(math.erf)
    gelu = lambda g: 0.5 * g * (1 + erf(g / math.sqrt(2)))  # noqa: E731
    gelu_tanh = lambda g: 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))  # noqa: E731
    silu = lambda g: g / (1 + np.exp(-g))  # noqa: E731
    plain = {"silu": silu, "gelu_erf": gelu, "gelu_tanh": gelu_tanh, "relu2": lambda g: np.maximum(g, 0) ** 2}
    if activation in plain:
        return plain[activation](y)
    ffn = y.shape[1] // 2
    block = {"concat": ffn, "interleaved": 1, "blocked8": 8}[layout]
    gate_rows = np.arange(ffn) // block * 2 * block + np.arange(ffn) % block
    g, u = y[:, gate_rows], y[:, gate_rows + block]
    if activation == "gptoss_glu":
        g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
        return (u + 1) * g / (1 + np.exp(-alpha * g))
    return {"swiglu": silu, "geglu_erf": gelu, "geglu_tanh": gelu_tanh}[activation](g) * u


def fake_quantized_fp8(x: np.ndarray, block: int) -> np.ndarray:
    """float64 rows x [rows, K] after e4m3 with one scale per `block` columns (quantize_rows_fp8's rule) and back."""
    rows, size = x.shape
    padded = np.pad(x, ((0, 0), (0, -size % block))).reshape(rows, -1, block)
    q, scale = quantize_rows_fp8(padded)
    return (q.astype(np.float64) * scale[..., None]).reshape(rows, -1)[:, :size]


def moe_experts_reference(hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation: str, layout: str,
                          alpha: float, limit: float, fp8: bool = False) -> np.ndarray:
    """out[t] = sum over j of weights[t, j] * down_e(act(gate_up_e(hidden[t]))), e = ids[t, j] in [0, E) (other
    ids add nothing); the gate+up output and the activation rounded to hidden's dtype, the sum rounded once. fp8:
    the GEMMs' inputs e4m3 too, hidden with a scale per token, the activation one per 1 x 128 block."""
    dtype = hidden.dtype
    rounded = lambda v: v.astype(dtype).astype(np.float64)  # noqa: E731
    x, out = hidden.astype(np.float64), np.zeros(hidden.shape, np.float64)
    if fp8:
        x = fake_quantized_fp8(x, x.shape[1])
    for e in range(w_down.shape[0]):
        tokens, slots = np.nonzero(ids == e)
        if not len(tokens):
            continue
        y = x[tokens] @ w_gate_up[e].astype(np.float64).T
        y = rounded(y if b_gate_up is None else y + b_gate_up[e].astype(np.float64))
        h = rounded(_moe_activation(y, activation, layout, alpha, limit))
        z = (fake_quantized_fp8(h, 128) if fp8 else h) @ w_down[e].astype(np.float64).T
        z = z if b_down is None else z + b_down[e].astype(np.float64)
        np.add.at(out, tokens, weights[tokens, slots].astype(np.float64)[:, None] * z)
    return out.astype(dtype)


class MoEExperts(OpRun):
    op_domain = GROUPED_MM_DOMAIN

    def _run(self, hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up=None, b_down=None,
             w_gate_up_scale=None, w_down_scale=None, activation=None, gate_up_layout=None, alpha=None, limit=None,
             group_size=0, plugin_version=None, plugin_namespace=None):
        names = {value: name for name, value in MOE_ACTIVATIONS.items()}
        layout = gate_up_layout.decode() if isinstance(gate_up_layout, bytes) else gate_up_layout
        if group_size:  # INT4: H and F from the hidden states and the down weights' rows
            w_gate_up = int4_dequantized(w_gate_up, w_gate_up_scale, hidden.shape[1], group_size)
            ffn = w_gate_up.shape[1] // (2 if names[activation] in MOE_GATED_ACTIVATIONS else 1)
            w_down = int4_dequantized(w_down, w_down_scale, ffn, group_size)
        fp8 = not group_size and w_gate_up_scale is not None
        if fp8:  # e4m3 weights (int8 bits or float8) [E, out, in], float32 scales per output channel
            w_gate_up, w_down = (w.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale[..., None]
                                 for w, scale in ((w_gate_up, w_gate_up_scale), (w_down, w_down_scale)))
        return (moe_experts_reference(hidden, topk_ids, topk_weights, w_gate_up, w_down, b_gate_up, b_down,
                                      names[activation], layout, alpha, limit, fp8),)


assert MoEExperts.__name__ == MOE_EXPERTS_OP


class GatherElements(OpRun):
    """ONNX GatherElements via np.take_along_axis. onnx 1.23's reference version goes through
    np.choose, which takes at most 64 entries along the axis (the counting sort gathers along
    the expert axis)."""

    def _run(self, data, indices, axis=0):
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(model, new_ops=[GroupedMM, MoEExperts, GatherElements])


def to_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every bf16/fp16 tensor, cast and IO type made float32."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph

    def upcast_tensor(tensor: onnx.TensorProto) -> None:
        if tensor.data_type in _LOW_PRECISION:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))

    for tensor in graph.initializer:
        upcast_tensor(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type in ("Cast", "EyeLike", "RandomNormal") and attr.name in ("to", "dtype") \
                    and attr.i in _LOW_PRECISION:
                attr.i = onnx.TensorProto.FLOAT
            if attr.type == onnx.AttributeProto.TENSOR:
                upcast_tensor(attr.t)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type in _LOW_PRECISION:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model
