"""The delegate built with TensorRT 11.1's headers picks its engine provider at init, for real on
this machine: with the TensorRT for RTX wheel installed it loads libtensorrt_rtx.so.1, logs the
choice and why, and refuses where the CUDA driver is missing (no GPU here), naming it; with
neither TensorRT nor TensorRT for RTX it refuses naming both missing libraries. Nothing crashes.
(The decision itself is unit-tested over every case in runtime/tests/provider_choice_test.cc.)
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from support.runtime_runs import joined_log

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = REPO / "runtime" / "build-tensorrt-11.1"


@pytest.fixture(scope="module")
def runner() -> pathlib.Path:
    path = BUILD / "et_trt_runner"
    if not path.is_file():
        pytest.skip(f"{path} is not built: scripts/build_tensorrt_layers.sh builds it where "
                    "../shared/third_party/tensorrt holds TensorRT's headers")
    return path


@pytest.fixture(scope="module")
def rtx_dir() -> str:
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None:
        pytest.skip("TensorRT for RTX is not installed (pip install -e '.[tensorrt-rtx]', as scripts/setup.sh does)")
    return str(pathlib.Path(spec.origin).parent)


def _run(args, **env) -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("ET_TRT_PROVIDER", "ET_TRT_TENSORRT_RTX_DIR")}
    environment.update(env)
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", timeout=300,
                            env=environment)
    return result.returncode, joined_log(result.stderr)


def test_with_tensorrt_rtx_installed_init_refuses_naming_the_cuda_driver(runner, rtx_dir, example_pte):
    rc, log = _run([runner, example_pte, "--iterations", "1"], ET_TRT_TENSORRT_RTX_DIR=rtx_dir)
    assert rc == 1, log
    assert re.search(r"uses TensorRT for RTX 1\.7\.\d+\.\d+: the blob carries no engine; TensorRT for RTX is "
                     r"installed and builds it from the ONNX", log), log
    assert "TensorRT for RTX is installed, but cannot load the CUDA driver library libcuda.so.1" in log, log


def _load_method_in_python(pte: pathlib.Path, **env) -> tuple[int, str]:
    """Loads `pte`'s method through the Python runtime, with this build's delegate, in a child process: its exit
    code (3: refused with a Python exception) and log."""
    library = BUILD / "libet_trt_runtime.so"
    if not library.is_file():
        pytest.skip(f"{library} is not built (scripts/build_tensorrt_layers.sh)")
    script = (
        "from executorch.runtime import Runtime\n"
        "from et_trt_backend import runtime\n"
        "runtime.load()\n"
        f"program = Runtime.get().load_program({str(pte)!r})\n"
        "try:\n"
        "    program.load_method('forward')\n"
        "except Exception:\n"
        "    raise SystemExit(3)\n"
    )
    return _run([sys.executable, "-c", script], ET_TRT_RUNTIME_LIBRARY=str(library),
                PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)), **env)


def test_the_python_loader_finds_the_tensorrt_rtx_wheel(rtx_dir, example_pte):
    """et_trt_backend.runtime.load() points the delegate at the installed wheel by itself."""
    rc, log = _load_method_in_python(example_pte)
    assert rc == 3, log
    assert "TensorRT for RTX is installed, but cannot load the CUDA driver library libcuda.so.1" in log, log


def test_with_neither_provider_init_names_both_missing_libraries(runner, example_pte, tmp_path):
    rc, log = _run([runner, example_pte, "--iterations", "1"], ET_TRT_TENSORRT_RTX_DIR=str(tmp_path))
    assert rc == 1, log
    assert "no engine provider is installed: TensorRT: TensorRT is not installed here: cannot load libnvinfer.so.11" \
        in log, log
    assert f"TensorRT for RTX: TensorRT for RTX is not installed here: cannot load {tmp_path}/libtensorrt_rtx.so.1" \
        in log, log


def test_a_provider_asked_for_that_is_missing_is_refused(runner, rtx_dir, example_pte):
    rc, log = _run([runner, example_pte, "--iterations", "1"], ET_TRT_TENSORRT_RTX_DIR=rtx_dir,
                   ET_TRT_PROVIDER="tensorrt")
    assert rc == 1, log
    assert "ET_TRT_PROVIDER=tensorrt asks for TensorRT, which is not available here: TensorRT is not installed " \
        "here: cannot load libnvinfer.so.11" in log, log


def test_an_unknown_provider_value_is_refused(runner, example_pte):
    rc, log = _run([runner, example_pte, "--iterations", "1"], ET_TRT_PROVIDER="rtx")
    assert rc == 1, log
    assert "ET_TRT_PROVIDER='rtx' is not one of tensorrt, tensorrt-rtx, auto" in log, log


def test_export_time_tensorrt_builds_say_tensorrt_is_missing(rtx_dir):
    """The builder's TensorRT provider (engines for this GPU at export) opens TensorRT only, even where only
    TensorRT for RTX is installed: it says TensorRT is missing; TensorRT for RTX loads."""
    library = BUILD / "libet_trt_plugin.so"
    if not library.is_file():
        pytest.skip(f"{library} is not built (scripts/build_tensorrt_layers.sh)")
    script = (
        "from et_trt_backend.engines import providers\n"
        "try:\n"
        "    providers.tensorrt()\n"
        "except providers.BuilderUnavailable as e:\n"
        "    print('UNAVAILABLE:', e)\n"
        "print('RTX:', providers.tensorrt_rtx())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "ET_TRT_PLUGIN_LIBRARY": str(library), "ET_TRT_TENSORRT_RTX_DIR": rtx_dir,
                                 "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "UNAVAILABLE: TensorRT is not installed here: cannot load libnvinfer.so.11" in result.stdout, \
        result.stdout + result.stderr[-3000:]
    assert re.search(r"RTX: TensorRT for RTX 1\.7\.\d+\.\d+", result.stdout), result.stdout


@pytest.mark.parametrize("lead", [0, 1])
def test_a_non_ascii_venv_path_in_the_refusal_does_not_abort_python(example_pte, tmp_path, lead):
    """Issue 34: a venv under a non-ASCII folder puts its path (the TensorRT for RTX wheel's folder) into the
    "no engine provider is installed" line, longer than one log line. Cut inside a character, that line made
    ExecuTorch's Python log sink throw and abort the process; `lead` shifts the path by a byte so that one of
    the two runs would cut a character."""
    venv = tmp_path / ("a" * lead + "робот_политика_" * 12) / "site-packages" / "tensorrt_rtx_libs"
    rc, log = _load_method_in_python(example_pte, ET_TRT_TENSORRT_RTX_DIR=str(venv))
    assert rc == 3, log[-3000:]  # a Python exception, not SIGABRT (-6)
    assert "no engine provider is installed: TensorRT: " in log, log[-3000:]
    assert f"TensorRT for RTX is not installed here: cannot load {venv}/libtensorrt_rtx.so.1" in log, log[-3000:]
