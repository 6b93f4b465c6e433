"""The MoEExperts op's semantics on the CPU: et_trt_backend.moe_experts.reference against an independent float64
computation and against PyTorch's bf16 MoE block, its layouts and input checks, and the activation table's C++
mirror. The kernels are tested in tests/test_moe_experts_kernels.py (Triton's interpreter) and
tests/test_moe_experts_gpu.py."""

import pathlib
import re

import pytest
import torch
from torch.nn import functional as F

from support.moe_inputs import make_inputs

from et_trt_backend import moe_experts, plugin_names

REPO = pathlib.Path(__file__).resolve().parents[1]
ACTIVATIONS = list(plugin_names.MOE_ACTIVATIONS)


def float64_experts(hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation, layout):
    """The contract computed token by token in float64, with its two roundings to hidden's dtype."""
    dtype = hidden.dtype
    experts, rows, _ = w_gate_up.shape
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if not 0 <= e < experts:
                continue
            gate_up = w_gate_up[e].double() @ hidden[t].double()
            if b_gate_up is not None:
                gate_up += b_gate_up[e].double()
            gate_up = gate_up.to(dtype).double()
            if moe_experts.is_gated(activation):
                ffn = rows // 2
                block = {"concat": ffn, "interleaved": 1, "blocked8": 8}[layout]
                gate = torch.tensor([f // block * 2 * block + f % block for f in range(ffn)])
                g, u = gate_up[gate], gate_up[gate + block]
                if activation == "gptoss_glu":
                    g, u = g.clamp(max=7.0), u.clamp(-7.0, 7.0)
                    h = (u + 1) * g / (1 + torch.exp(-1.702 * g))
                elif activation == "swiglu":
                    h = g / (1 + torch.exp(-g)) * u
                elif activation == "geglu_tanh":
                    h = F.gelu(g, approximate="tanh") * u
                else:
                    h = F.gelu(g) * u
            else:
                x = gate_up
                h = {"silu": lambda: x / (1 + torch.exp(-x)), "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
                     "gelu_erf": lambda: F.gelu(x), "relu2": lambda: x.clamp(min=0) ** 2}[activation]()
            y = w_down[e].double() @ h.to(dtype).double()
            if b_down is not None:
                y += b_down[e].double()
            out[t] += float(weights[t, j]) * y
    return out


def rel_err(x, ref):
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-12))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reference_matches_float64(activation, dtype):
    inputs = make_inputs(13, 3, 6, 24, 16, activation, dtype=dtype, bias=True, invalid=0.2, seed=1)
    layout = "interleaved" if activation == "gptoss_glu" else "concat"
    out = moe_experts.reference(*inputs, activation=activation, gate_up_layout=layout)
    assert out.dtype == dtype and out.shape == (13, 24)
    ref = float64_experts(*inputs, activation, layout)
    # Both round the gate+up output and the activation at the same places; float32 against float64 moves an
    # element by one step of the dtype at most, and the result's own rounding adds one more.
    assert rel_err(out, ref) < 4e-3


@pytest.mark.parametrize("source", plugin_names.MOE_GATE_UP_LAYOUTS)
@pytest.mark.parametrize("target", plugin_names.MOE_GATE_UP_LAYOUTS)
def test_relayout_keeps_the_result(source, target):
    hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down = make_inputs(9, 2, 4, 16, 24, "swiglu", bias=True)
    moved, moved_bias = moe_experts.relayout(w_gate_up, b_gate_up, source, target)
    want = moe_experts.reference(hidden, ids, weights, w_gate_up, w_down, b_gate_up, b_down, gate_up_layout=source)
    got = moe_experts.reference(hidden, ids, weights, moved, w_down, moved_bias, b_down, gate_up_layout=target)
    assert torch.equal(got, want)
    if source != target:  # the rows really moved
        assert not torch.equal(moved, w_gate_up)


def test_blocked8_rows():
    gate, up = moe_experts.gate_up_rows("blocked8", 16)
    assert gate.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]
    assert up.tolist() == [8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31]
    assert moe_experts.gate_up_rows("interleaved", 3)[1].tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match="multiple of 8"):
        moe_experts.gate_up_rows("blocked8", 12)


def test_invalid_ids_contribute_nothing():
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(20, 4, 5, 16, 8, "silu", invalid=0.3, seed=2)
    out = moe_experts.reference(hidden, ids, weights, w_gate_up, w_down, activation="silu")
    kept = (ids >= 0) & (ids < 5)
    assert not kept.all() and kept.any()
    clean = moe_experts.reference(hidden, torch.where(kept, ids, 0), weights * kept, w_gate_up, w_down,
                                  activation="silu")
    assert torch.equal(out, clean)  # an invalid id is a pair of weight 0
    all_invalid = moe_experts.reference(hidden, torch.full_like(ids, -1), weights, w_gate_up, w_down,
                                        activation="silu")
    assert (all_invalid == 0).all()


def test_no_tokens_and_no_slots():
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(0, 2, 4, 16, 8, "swiglu")
    assert moe_experts.reference(hidden, ids, weights, w_gate_up, w_down).shape == (0, 16)
    hidden, ids, weights, w_gate_up, w_down, _, _ = make_inputs(3, 0, 4, 16, 8, "swiglu")
    assert (moe_experts.reference(hidden, ids, weights, w_gate_up, w_down) == 0).all()


def test_matches_pytorch_bf16_moe_block():
    """The experts of tests/moe_models.GroupedMoE (PyTorch's own bf16 ops) given its router's ids and weights."""
    from support.moe_models import GroupedMoE, bf16

    model = bf16(GroupedMoE(hidden=64, ffn=48, experts=8, top_k=2), seed=3)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        weights, ids = model.route(x)
        want = model(x)
    got = moe_experts.reference(x, ids.int(), weights, model.gate_up_proj.data, model.down_proj.data)
    # PyTorch rounds the SiLU, the product, the down output and the weighted rows to bf16 as well.
    assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a.update(hidden=a["hidden"].double()), "hidden must be"),
    (lambda a: a.update(topk_ids=a["topk_ids"].long()), "topk_ids must be int32"),
    (lambda a: a.update(topk_weights=a["topk_weights"][:, :1]), "topk_weights must be"),
    (lambda a: a.update(w_gate_up=a["w_gate_up"][:, :8]), r"w_gate_up must be \[E, N1, H\] = \[4, 16, 16\]"),
    (lambda a: a.update(w_down=a["w_down"].half()), "w_down must be"),
    (lambda a: a.update(b_down=torch.zeros(4, 15, dtype=torch.bfloat16)), "b_down must be"),
    (lambda a: a.update(activation="gelu"), "unknown MoE activation 'gelu'"),
    (lambda a: a.update(gate_up_layout="rows"), "unknown gate_up_layout 'rows'"),
])
def test_bad_inputs_are_named(mutate, match):
    names = ("hidden", "topk_ids", "topk_weights", "w_gate_up", "w_down", "b_gate_up", "b_down")
    args = dict(zip(names, make_inputs(3, 2, 4, 16, 8, "swiglu")), activation="swiglu", gate_up_layout="concat")
    mutate(args)
    with pytest.raises(ValueError, match=match):
        moe_experts.reference(**args)


def test_cpp_activation_and_layout_tables_mirror_python():
    """runtime/kernels/moe_experts_launcher.h's enums hold plugin_names' values, name for name."""
    header = (REPO / "runtime/kernels/moe_experts_launcher.h").read_text()

    def enum(name):
        body = re.search(r"enum class %s : int32_t \{(.*?)\};" % name, header, re.S).group(1)
        return {m[0][1:].lower(): int(m[1]) for m in re.findall(r"(k\w+) = (\d+),", body)}

    assert enum("MoEActivation") == {n.replace("_", ""): v for n, v in plugin_names.MOE_ACTIVATIONS.items()}
    assert int(re.search(r"kMoEActivationCount = (\d+);", header)[1]) == len(plugin_names.MOE_ACTIVATIONS)
    gated = re.search(r"is_gated\(MoEActivation activation\) \{ return static_cast<int32_t>\(activation\) <= (\d+)",
                      header)
    assert [n for n, v in plugin_names.MOE_ACTIVATIONS.items() if v <= int(gated[1])] == list(
        plugin_names.MOE_GATED_ACTIVATIONS)
    assert enum("GateUpLayout") == {n: i for i, n in enumerate(plugin_names.MOE_GATE_UP_LAYOUTS)}
