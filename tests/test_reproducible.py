"""Exports are reproducible: the same model and options give the same .pte from any checkout.

Content ids key engine caches on robots, so they must depend on the model and its
options only. A copy of this checkout in another folder exports the example policy
with fresh kernel and Triton caches (so every kernel image is compiled anew), and
its .pte must be byte-identical to this test run's export of the example
(tests/conftest.py: from this checkout, with the kernel cache the setup warmed).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("et_trt_backend", "partitioner", "examples")


def _checkout_copy(where: pathlib.Path) -> pathlib.Path:
    """The package sources and the example, copied to `where`; et_trt_partitioner importable from it."""
    for name in SOURCES:
        shutil.copytree(REPO / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    (where / "et_trt_partitioner").symlink_to(where / "partitioner")
    return where


def _export(checkout: pathlib.Path) -> bytes:
    env = {**os.environ, "PYTHONPATH": str(checkout), "ET_TRT_KERNEL_CACHE": str(checkout / "kernel_cache"),
           "TRITON_CACHE_DIR": str(checkout / "triton_cache")}
    code = ("import et_trt_backend, et_trt_partitioner, sys\n"
            f"assert et_trt_backend.__file__.startswith({str(checkout)!r}), et_trt_backend.__file__\n"
            f"assert et_trt_partitioner.__file__.startswith({str(checkout)!r}), et_trt_partitioner.__file__\n"
            "from et_trt_partitioner import cli\n"
            "sys.exit(cli.main(['-q', 'export', '--output', 'policy.pte']))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return (checkout / "policy.pte").read_bytes()


@pytest.mark.slow
def test_a_cold_export_in_another_checkout_gives_the_same_bytes(tmp_path, example_pte):
    cold = _export(_checkout_copy(tmp_path / "somewhere" / "else" / "checkout"))
    warm = example_pte.read_bytes()
    if cold != warm:
        from et_trt_backend.serialization.pte import read_partitions

        differing = []
        for a, b in zip(read_partitions(cold), read_partitions(warm)):
            differing += [f"{a.contents.part}: onnx"] if a.contents.onnx != b.contents.onnx else []
            differing += [f"{a.contents.part}: {k.kernel} {k.arch} {k.format}"
                          for k, j in zip(a.contents.kernels, b.contents.kernels) if k.image != j.image]
        pytest.fail(f"the exports differ: {differing or 'outside the blobs'}")
