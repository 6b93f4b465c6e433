"""FP8 quantization (et_trt_backend/quantization.py) against an independent numpy/ml_dtypes form of the contract."""

import numpy as np
import pytest
import torch

from et_trt_backend import quantization
from support import onnx_reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA GPU on this machine"))]


def _weights(groups=3, n=20, k=37, device="cpu") -> torch.Tensor:
    w = torch.randn(groups, n, k, device=device) * torch.logspace(-3, 2, n, device=device)[None, :, None]
    w[0, 1] = 0  # an all-zero channel: scale 1
    w[1, 2, 5] = 1e4  # one large value: the rest of its channel underflows toward zero
    return w.to(torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_weights_match_the_independent_form_bit_for_bit(device):
    w = _weights(device=device)
    b_q, b_scale = quantization.quantize_weights_fp8(w)
    assert b_q.dtype == torch.float8_e4m3fn and b_scale.dtype == torch.float32
    values, scales = onnx_reference.quantize_rows_fp8(w.float().cpu().numpy())
    np.testing.assert_array_equal(b_scale.cpu().numpy(), scales)
    np.testing.assert_array_equal(b_q.float().cpu().numpy(), values)
    assert b_scale[0, 1] == 1.0 and not torch.isnan(b_q.float()).any()
    # Each channel's largest magnitude maps to +-448; every value is within half an e4m3 step (2^-4 relative)
    # or, below e4m3's normal range, within half its subnormal step (2^-10 x scale).
    assert torch.equal(b_q.float().abs().amax(-1)[b_scale != 1], torch.full_like(b_scale[b_scale != 1], 448.0))
    error = (b_q.float() * b_scale[..., None] - w.float()).abs()
    assert (error <= torch.maximum(w.float().abs() * 2**-4, b_scale[..., None] * 2**-10) * 1.0001).all()


@pytest.mark.parametrize("device", DEVICES)
def test_reference_grouped_mm_follows_the_groups_and_the_scales(device):
    torch.manual_seed(0)
    rows, k, n = 23, 40, 17
    a = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    b_q, b_scale = quantization.quantize_weights_fp8(torch.randn(4, n, k, device=device))
    for offs in ([5, 5, 12, 20], [7, 3, 30, 40], [-4, 9, 9, 200], [0, 0, 0, 0]):
        offs_t = torch.tensor(offs, dtype=torch.int32, device=device)
        got = quantization.grouped_mm_fp8_reference(a, b_q, b_scale, offs_t)
        assert got.dtype == torch.float32 and got.shape == (rows, n)
        a_q, a_scale = quantization.quantize_rows_fp8(a)
        expected = np.zeros((rows, n))
        start = 0
        for g, end in enumerate(offs):  # float64 from the dequantized operands
            end = min(max(end, start), rows)
            dq_a = a_q[start:end].double().cpu() * a_scale[start:end, None].double().cpu()
            expected[start:end] = (dq_a @ (b_q[g].double().cpu() * b_scale[g, :, None].double().cpu()).T).numpy()
            start = end
        np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(  # the ONNX reference evaluator's independent form
            got.cpu().numpy(), onnx_reference.grouped_mm_fp8_reference(
                a.float().cpu().numpy(), b_q.cpu().view(torch.uint8).numpy(), np.array(offs), b_scale.cpu().numpy()))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="inf or NaN"):
        quantization.quantize_weights_fp8(torch.tensor([[[1.0, float("inf")]]]))
    with pytest.raises(ValueError, match=r"\[G, N, K\]"):
        quantization.quantize_weights_fp8(torch.ones(4, 4))
    b_q, b_scale = quantization.quantize_weights_fp8(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match=r"want \[rows, 4\]"):
        quantization.grouped_mm_fp8_reference(torch.ones(5, 3), b_q, b_scale, torch.tensor([1, 5]))
