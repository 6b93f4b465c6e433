"""The NVIDIA builders tests use, or a skip that says what is missing."""

from __future__ import annotations

import pytest

from et_trt_backend.engines import providers


def tensorrt_rtx_or_skip() -> providers.Builder:
    """TensorRT for RTX, ready to build; skips the test (with the reason) where it is absent or unusable."""
    try:
        return providers.tensorrt_rtx()
    except providers.BuilderUnavailable as e:
        pytest.skip(f"needs TensorRT for RTX ({providers.RTX_EXTRA}): {e}")
