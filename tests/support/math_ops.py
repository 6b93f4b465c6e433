"""Elementwise math, activations, reductions and index ops of robot policies, as op_checks families."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from support import op_checks

aten = torch.ops.aten


def _index_put(x, indices, values, accumulate=False):
    return aten.index_put.default(x, indices, values, accumulate)


def _setitem_dim1(x, idx, v):
    out = x.clone()
    out[:, idx] = v
    return out


def _inputs_math(batch: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(16), "y": torch.randn(16)}


def _inputs_index(batch: int) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(3, 5, 4), "v": torch.randn(3, 2, 4), "acc": torch.randn(3, 6, 4),
        "rows": torch.randn(4, 4),
        "i": torch.tensor([0, -2]), "j": torch.tensor([1, 3]), "dup": torch.tensor([0, 2, 0, -1, 4, 2]),
        "ids": torch.randint(0, 10, (2, 5)),
        "values": torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0, math.nan]) * torch.rand(1).add(0.5),
        "bounds": torch.tensor([-1.0, 0.0, 1.0]),
    }


# family -> (ops, layers, fresh inputs)
FAMILIES = {
    "unary math": op_checks.Family({
        "log1p": lambda m, i: torch.log1p(i["x"].abs()),
        "expm1": lambda m, i: torch.expm1(i["x"]),
        "log2": lambda m, i: torch.log2(i["x"].abs() + 0.1),
        "log10": lambda m, i: torch.log10(i["x"].abs() + 0.1),
        "sign": lambda m, i: torch.sign(i["x"]),
        "trunc": lambda m, i: torch.trunc(3 * i["x"]),
        "tan": lambda m, i: torch.tan(i["x"]),
        "asin": lambda m, i: torch.asin(i["x"].clamp(-0.9, 0.9)),
        "acos": lambda m, i: torch.acos(i["x"].clamp(-0.9, 0.9)),
        "atan": lambda m, i: torch.atan(i["x"]),
        "sinh": lambda m, i: torch.sinh(i["x"]),
        "cosh": lambda m, i: torch.cosh(i["x"]),
        "asinh": lambda m, i: torch.asinh(i["x"]),
        "acosh": lambda m, i: torch.acosh(i["x"].abs() + 1),
        "atanh": lambda m, i: torch.atanh(i["x"].clamp(-0.9, 0.9)),
        "isnan": lambda m, i: torch.isnan(i["x"].log()),
        "isinf": lambda m, i: torch.isinf(1 / (i["x"] * (i["y"] > 0))),
    }, {}, _inputs_math),
    "activations": op_checks.Family({
        "mish": lambda m, i: F.mish(i["x"]),
        "softplus beta 2, threshold 1": lambda m, i: F.softplus(3 * i["x"], beta=2, threshold=1),
        "gelu tanh": lambda m, i: F.gelu(i["x"], approximate="tanh"),
        "gelu erf": lambda m, i: F.gelu(i["x"]),
        "silu": lambda m, i: F.silu(i["x"]),
        "elu": lambda m, i: F.elu(i["x"], alpha=0.7),
        "hardswish": lambda m, i: F.hardswish(4 * i["x"]),
        "hardsigmoid": lambda m, i: F.hardsigmoid(4 * i["x"]),
        "leaky_relu": lambda m, i: F.leaky_relu(i["x"], 0.1),
    }, {}, _inputs_math),
    "binary and reductions": op_checks.Family({
        "atan2": lambda m, i: torch.atan2(i["x"], i["y"]),
        "fmod by a tensor": lambda m, i: torch.fmod(5 * i["x"], i["y"].abs() + 0.5),
        "fmod by a scalar": lambda m, i: torch.fmod(5 * i["x"], 1.5),
        "floor division by a scalar": lambda m, i: torch.div(5 * i["x"], 2.0, rounding_mode="floor"),
        "logical_xor": lambda m, i: torch.logical_xor(i["x"] > 0, i["y"] > 0),
        "bool ^ bool": lambda m, i: (i["x"] > 0) ^ (i["y"] > 0),
        "bool & scalar": lambda m, i: (i["x"] > 0) & True,
        "bool | scalar": lambda m, i: (i["x"] > 0) | False,
        "bool ^ scalar": lambda m, i: (i["x"] > 0) ^ True,
        "prod over a dim": lambda m, i: i["x"].view(4, 4).prod(1),
        "prod of all": lambda m, i: (i["x"] / 2 + 1).prod(),
        "mean of all": lambda m, i: i["x"].mean(),
        "any of all": lambda m, i: (i["x"] > 2).any(),
        # amax / amin with no dim reduce every axis (an FP8 scale, a range check); torchlib's form needs a dim
        "amax of all": lambda m, i: i["x"].abs().amax(),
        "amin of all, keepdim": lambda m, i: i["x"].view(4, 4).amin(keepdim=True),
        "amax over a dim": lambda m, i: i["x"].view(4, 4).amax(1),
        # Attention-mask code (pi0, SmolVLA's make_att_2d_masks): counts of a bool mask, bool * bool.
        "sum of a bool mask over a dim": lambda m, i: (i["x"].view(4, 4) > 0).sum(1),
        "bool * bool": lambda m, i: (i["x"] > 0)[:, None] * (i["y"] < 0.5)[None, :],
        "flip": lambda m, i: i["x"].view(2, 8).flip(0, 1),
    }, {}, _inputs_math),
    "indexing": op_checks.Family({
        "index_put on dim 1, negative index": lambda m, i: _index_put(i["x"], [None, i["i"]], i["v"]),
        "index_put on dims 1 and 2": lambda m, i: _index_put(i["x"], [None, i["i"], i["j"]], i["v"][..., 0]),
        "x[:, idx] = v (setitem)": lambda m, i: _setitem_dim1(i["x"], i["j"], i["v"]),
        "index_put accumulate on dim 1, duplicates": lambda m, i: _index_put(i["x"], [None, i["dup"]], i["acc"], True),
        "index_put accumulate on dim 0, broadcast values": lambda m, i: _index_put(i["rows"], [i["dup"][:4]],
                                                                                  i["rows"][0], True),
        "index_add on dim 1": lambda m, i: i["x"].index_add(1, i["dup"] % 5, i["acc"]),
        "bucketize": lambda m, i: torch.bucketize(i["values"], i["bounds"]),
        "bucketize right, int32": lambda m, i: torch.bucketize(i["values"], i["bounds"], right=True, out_int32=True),
        "embedding of int64 ids": lambda m, i: m["embedding"](i["ids"]),
    }, {"embedding": nn.Embedding(10, 4)}, _inputs_index),
}
