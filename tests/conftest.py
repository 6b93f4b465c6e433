"""Fixtures shared by test modules."""

import fcntl
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from support import torchvision_cpu

torchvision_cpu.allow_import()  # before any test module imports transformers or torchvision

REPO = pathlib.Path(__file__).resolve().parents[1]

logger = logging.getLogger(__name__)


def run_folder(tmp_path_factory) -> pathlib.Path:
    """A folder of this test run that its pytest-xdist workers share (each worker's temporary folder is
    below it); this run's own temporary folder without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def pytest_collection_modifyitems(items):
    """The modules that export whole models (`slow` tests) first, those with the most first: pytest-xdist's
    loadfile hands out modules in collection order (scripts/test.sh turns off its reordering by test count,
    which started the one-test exports last, one worker running them alone at the end)."""
    slow = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])  # stable: a module's tests keep their order


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


@pytest.fixture(scope="session")
def example_pte(tmp_path_factory) -> pathlib.Path:
    """The example policy exported by `et-trt export` with its defaults (the bundled policy and recipe,
    the kernel cache the setup warmed), once per test run: the pytest-xdist workers share it, one
    exports while the others wait. Read-only: a test that needs it changed writes a copy."""
    folder = run_folder(tmp_path_factory) / "example_export"
    folder.mkdir(exist_ok=True)
    path = folder / "moe_policy.pte"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            logger.info("exporting the example policy for this test run to %s", path)
            result = subprocess.run([sys.executable, "-m", "et_trt_partitioner.cli", "-q", "export", "--output", str(path)],
                                    capture_output=True, text=True, timeout=1800)
            assert result.returncode == 0, f"et-trt export failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
            path.chmod(0o444)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    yield path
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"a test changed the shared export {path}"


@pytest.fixture(scope="session")
def launcher_library(tmp_path_factory) -> pathlib.Path:
    """The standalone CMake build of runtime/kernels (the launchers and their C ABI library), with no warnings;
    once per test run: the pytest-xdist workers share it, one builds while the others wait."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    build = run_folder(tmp_path_factory) / "kernels_build"
    build.mkdir(exist_ok=True)
    with open(build / ".pytest-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build / "build.log").is_file():
            subprocess.run([cmake, "-S", REPO / "runtime" / "kernels", "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                           check=True, capture_output=True)
            result = subprocess.run([cmake, "--build", build, "-j2"], capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr
            (build / "build.log").write_text(result.stdout)
    assert "warning" not in (build / "build.log").read_text().lower()
    return build
