"""Fixtures shared by test modules."""

import os

import pytest

from et_trt_backend.kernels import aot


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """One fresh kernel-image disk cache per module: every image is compiled there once."""
    old = os.environ.get(aot.CACHE_ENV)
    os.environ[aot.CACHE_ENV] = str(tmp_path_factory.mktemp("kernel_cache"))
    yield
    if old is None:
        del os.environ[aot.CACHE_ENV]
    else:
        os.environ[aot.CACHE_ENV] = old
