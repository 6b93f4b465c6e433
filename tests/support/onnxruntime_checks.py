"""ONNX numerics of whole transformers models through onnxruntime (the dense GroupedMM form, which it runs):
token-id or float inputs, and the one partition's ONNX against the unmodified module run eagerly in float32."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import torch

from et_trt_backend.serialization import blob, external_data
from support import moe_models, onnx_reference

MODULE_TOLERANCE = dict(rtol=1e-2, atol=5e-3)


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_input(spec: blob.TensorSpec, shape: list[int]) -> torch.Tensor:
    """Token ids for integer inputs, normal floats otherwise."""
    if spec.dtype in (torch.int32, torch.int64):
        return torch.randint(0, moe_models.HF_VOCAB, shape, dtype=spec.dtype)
    return torch.randn(shape)


def assert_onnx_matches_module(module, contents: blob.BlobContents, tokens: int) -> None:
    """The one partition's ONNX (float32 twin) against the unmodified module run eagerly in float32."""
    (spec,) = contents.inputs
    x = random_input(spec, [1, tokens] + ([moe_models.HF_HIDDEN] if spec.dtype.is_floating_point else []))
    with torch.no_grad():
        expected = copy.deepcopy(module).float()(x).float().numpy()  # the program shares its weights
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    (got,) = run_onnxruntime(model, {spec.name: x.numpy()})
    np.testing.assert_allclose(got, expected, **MODULE_TOLERANCE)
