"""Fixtures shared by test modules."""

import fcntl
import importlib.util
import os
import pathlib
import shutil
import subprocess

import pytest
from support import torchvision_cpu

from et_trt_backend.kernels import images

torchvision_cpu.allow_import()  # before any test module imports transformers or torchvision

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_runtime() -> pathlib.Path:
    """runtime/build, (re)built by scripts/build_runtime.sh (incremental: seconds when up to date)."""
    build = REPO / "runtime" / "build"
    build.mkdir(parents=True, exist_ok=True)
    # The test workers (pytest-xdist) share this folder: one builds while the others wait.
    with open(build / ".pytest-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run([str(REPO / "scripts" / "build_runtime.sh")], capture_output=True, text=True)
    assert result.returncode == 0, f"runtime build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert (build / "libet_trt_runtime.so").is_file() and (build / "et_trt_runner").is_file()
    return build


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """One fresh kernel-image disk cache per module: every image is compiled there once."""
    old = os.environ.get(images.CACHE_ENV)
    os.environ[images.CACHE_ENV] = str(tmp_path_factory.mktemp("kernel_cache"))
    yield
    if old is None:
        del os.environ[images.CACHE_ENV]
    else:
        os.environ[images.CACHE_ENV] = old


@pytest.fixture(scope="session")
def example_pte(tmp_path_factory) -> pathlib.Path:
    """The example policy's .pte: out/moe_policy.pte from scripts/setup.sh, else exported here."""
    existing = pathlib.Path(os.environ.get("ET_TRT_EXAMPLE_PTE", REPO / "out" / "moe_policy.pte"))
    if existing.is_file():
        return existing
    from executorch.exir import to_edge_transform_and_lower

    partitioner = pytest.importorskip("et_trt_partitioner")
    if not hasattr(partitioner, "TensorRTPartitioner"):
        pytest.skip("et_trt_partitioner.TensorRTPartitioner has not landed: no example .pte to run")
    TensorRTPartitioner = partitioner.TensorRTPartitioner

    spec = importlib.util.spec_from_file_location("moe_policy", REPO / "examples" / "moe_policy.py")
    moe_policy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe_policy)
    edge = to_edge_transform_and_lower(
        moe_policy.export_policy(), partitioner=[TensorRTPartitioner(REPO / "examples" / "recipe.toml")]
    )
    path = tmp_path_factory.mktemp("example") / "moe_policy.pte"
    path.write_bytes(edge.to_executorch().buffer)
    return path


@pytest.fixture(scope="session")
def launcher_library(tmp_path_factory) -> pathlib.Path:
    """The standalone CMake build of runtime/kernels (the launchers and their C ABI library), with no warnings."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    build = tmp_path_factory.mktemp("kernels_build")
    subprocess.run([cmake, "-S", REPO / "runtime" / "kernels", "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    result = subprocess.run([cmake, "--build", build, "-j2"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning" not in result.stdout.lower()
    return build
