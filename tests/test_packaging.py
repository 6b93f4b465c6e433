"""Packaging: the setuptools package list (editable installs) is complete, and `pip install .`
into a fresh venv (a wheel, not editable) ships everything the package needs at run time.

The fresh-venv test installs torch 2.13.0 (CPU), then this project with its pinned dependencies
from PyPI, building runtime/ with CMake in pip's build environment: a few minutes.
"""

import logging
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from et_trt_backend.kernels import sm90
from support.runtime_runs import NOT_BUILT, joined_log

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Variables that would point the installed package at this checkout's files instead of its own.
CHECKOUT_VARIABLES = ("PYTHONPATH", "ET_TRT_RUNTIME_LIBRARY", "ET_TRT_GROUPED_MM_LIB", "ET_TRT_PLUGIN_LIBRARY")

logger = logging.getLogger(__name__)


def _package_dirs(top: str, import_name: str) -> set[str]:
    base = ROOT / top
    return {
        ".".join([import_name, *init.parent.relative_to(base).parts])
        for init in base.rglob("__init__.py")
    }


def test_every_python_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = _package_dirs("et_trt_backend", "et_trt_backend") | _package_dirs("partitioner", "et_trt_partitioner")
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "these are listed in pyproject.toml but have no __init__.py"
    assert config["package-dir"]["et_trt_partitioner"] == "partitioner"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, environment, a folder outside the checkout): torch 2.13.0 first (so nothing pulls a
    CUDA build, as the README says), then `pip install <checkout>`, not editable."""
    where = tmp_path_factory.mktemp("installed")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {name: value for name, value in os.environ.items() if name not in CHECKOUT_VARIABLES}
    # pip writes no .pyc files, here or in the wheel's build environment (its pip reads PIP_COMPILE; pip's
    # --no-compile): compiling every installed module was much of the install's CPU time, and nothing here
    # tests byte-compilation. Python writes those of the modules the tests import, once, for the later runs.
    env["PIP_COMPILE"] = "0"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.monotonic()
    for what in ("torch==2.13.0", str(ROOT)):
        result = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", what], env=env,
                                capture_output=True, text=True, timeout=2400)
        assert result.returncode == 0, f"pip install {what}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    logger.info("torch and et-trt installed into a fresh venv in %.0f s", time.monotonic() - start)
    elsewhere = where / "elsewhere"
    elsewhere.mkdir()
    return venv, env, elsewhere


def _run(installed, *command: str) -> subprocess.CompletedProcess:
    venv, env, elsewhere = installed
    return subprocess.run([str(venv / "bin" / command[0]), *command[1:]], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=1800)


def _python(installed, code: str) -> subprocess.CompletedProcess:
    return _run(installed, "python", "-c", textwrap.dedent(code))


@pytest.fixture(scope="module")
def exported(installed) -> pathlib.Path:
    """The bundled example exported by the installed `et-trt export`, from a folder outside the checkout."""
    result = _run(installed, "et-trt", "export", "--output", "x.pte")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "x.pte:" in result.stdout, result.stdout
    return installed[2] / "x.pte"


@pytest.mark.slow
def test_the_installed_package_holds_its_libraries_sources_and_example(installed):
    result = _python(installed, """
        import et_trt_backend, et_trt_partitioner
        from et_trt_backend import runtime
        from et_trt_partitioner import cli
        from et_trt_backend.kernels import launcher, sm90
        for path in (et_trt_backend.__file__, et_trt_partitioner.__file__, runtime.library_path(),
                     launcher.library_path(), sm90.SOURCE, cli.EXAMPLES_DIR / "moe_policy.py", cli.EXAMPLE_RECIPE):
            print(path)
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    paths = [pathlib.Path(line) for line in result.stdout.splitlines()]
    site_packages = installed[0] / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert len(paths) == 7 and all(p.is_file() for p in paths), result.stdout
    for path in paths:
        assert path.is_relative_to(site_packages), f"{path} is not the installed package's"
    assert paths[2] == site_packages / "et_trt_backend" / "lib" / "libet_trt_runtime.so"
    assert paths[3] == site_packages / "et_trt_backend" / "lib" / "libet_trt_grouped_mm.so"


@pytest.mark.slow
def test_installed_export_and_inspect_from_another_folder(installed, exported):
    result = _run(installed, "et-trt", "inspect", str(exported))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "2 TensorRT partition(s)" in result.stdout, result.stdout[:3000]
    assert "part 'decoder'" in result.stdout and "part 'velocity'" in result.stdout, result.stdout[:3000]
    if sm90.nvcc_path() is not None:  # the sm_90a MoE builds of the installed grouped_mm_sm90.cu (nvcc's: persistent)
        assert re.search(r"sm_90a +cubin moe_gate_up_gated bf16 .*persistent$", result.stdout, re.M), \
            result.stdout[:6000]


@pytest.mark.slow
def test_installed_runtime_load_registers_the_delegate(installed, exported):
    """ExecuTorch's runtime reaches the delegate's init, which refuses only because TensorRT support
    is not built in (no TensorRT headers here): not a backend ExecuTorch does not know."""
    result = _python(installed, f"""
        from executorch.runtime import Runtime
        from et_trt_backend import BACKEND_ID, runtime
        print(runtime.load()._name)
        print(BACKEND_ID in Runtime.get().backend_registry.registered_backend_names)
        program = Runtime.get().load_program({str(exported)!r})
        try:
            program.load_method("forward")
        except Exception as e:
            print("refused:", type(e).__name__)
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    library, registered, refused = result.stdout.splitlines()
    assert library.endswith("site-packages/et_trt_backend/lib/libet_trt_runtime.so"), library
    assert registered == "True" and refused.startswith("refused:"), result.stdout
    log = joined_log(result.stderr)
    assert "EtTrtBackend: cannot initialize part" in log, result.stderr[-3000:]
    # A wheel's library names the wheel's way to build TensorRT in.
    assert f"{NOT_BUILT}: reinstall the package with TensorRT's headers: pip install . -C " \
        "cmake.define.ET_TRT_TENSORRT_INCLUDE_DIR=<dir with" in log, result.stderr[-3000:]


@pytest.mark.slow
def test_installed_eager_op_reaches_the_packaged_launcher(installed, exported):
    """torch.ops.et_trt.grouped_mm is registered and its launcher library, the package's, takes the
    export's kernel images; it then needs the CUDA driver, which only a GPU machine has."""
    result = _python(installed, f"""
        import ctypes.util
        import torch
        import et_trt_backend.kernels.op  # registers torch.ops.et_trt.grouped_mm
        import pathlib
        from et_trt_backend.kernels.launcher import GroupedMMLauncher, LauncherError
        from et_trt_backend.serialization import pte
        print(hasattr(torch.ops.et_trt, "grouped_mm"))
        images = pte.read_partitions(pathlib.Path({str(exported)!r}).read_bytes())[0].contents.kernels
        has_driver = ctypes.util.find_library("cuda") is not None
        try:
            GroupedMMLauncher([i for i in images if i.dtype == "bf16" and i.trans_b])
            print("created", has_driver)
        except LauncherError as e:
            print("refused", has_driver, e)
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    registered, outcome = result.stdout.splitlines()
    assert registered == "True", result.stdout
    if outcome.startswith("refused False"):
        assert "cannot load the CUDA driver library libcuda.so.1" in outcome, outcome
    else:
        assert outcome.startswith("created True"), outcome
