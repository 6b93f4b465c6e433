"""The C++ runtime: its build, its ctest suite, and the example .pte through both
ExecuTorch front ends (the Python runtime with et_trt_backend.runtime.load(), and
et_trt_runner), plus the runner's mechanics on a plain CPU program.

Without TensorRT (this machine, CI) a TensorRT partition cannot run: the tests
assert that init refuses it with a message saying why, and nothing crashes.
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from et_trt_backend import BACKEND_ID, runtime
from et_trt_backend.serialization.blob import deserialize
from et_trt_backend.serialization.pte import read_delegates
from support import damaged_pte
from support.runtime_runs import NOT_BUILT, RUNNER, joined_log, load_method_refused, run_process

REPO = pathlib.Path(__file__).resolve().parents[1]
CTEST = pathlib.Path(sys.executable).parent / "ctest"


# ---- the C++ tests ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctest_suite(built_runtime, example_pte):
    """gtest (blob reader, IO checks, engine cache, runner arguments and input files) and the
    AddressSanitizer corruption run over the writer's blobs and the example export's blobs:
    every raw mutant refused, nothing crashes."""
    env = dict(os.environ, ET_TRT_EXAMPLE_PTE=str(example_pte))
    result = run_process([CTEST, "--test-dir", built_runtime, "--output-on-failure", "-j2", "-V"], env=env)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert "100% tests passed" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "raw mutants" in line]
    assert any("/example_" in line for line in lines), f"no example blob was mutated:\n{result.stdout[-3000:]}"
    for line in lines:
        assert ", 0 accepted;" in line, line
        assert int(line.split(" raw mutants")[0].rsplit(" ", 1)[-1]) >= 1000, line
    named = [line for line in result.stdout.splitlines() if "named-data mutants" in line]
    assert named and all(line.endswith(", 0 accepted") for line in named), result.stdout[-3000:]


def test_configure_names_the_missing_system_package(tmp_path):
    """With the system's libraries out of reach, CMake names the Debian package and the script
    that installs it, not only the file it did not find."""
    import executorch

    configure = run_process([pathlib.Path(sys.executable).parent / "cmake", "-S", REPO / "runtime", "-B", tmp_path,
                             f"-DCMAKE_PREFIX_PATH={list(executorch.__path__)[0]}",
                             "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/"])
    message = " ".join(configure.stderr.split())  # CMake wraps its messages
    assert configure.returncode != 0
    assert "zlib (zlib.h, libz) not found: install the system package zlib1g-dev" in message, configure.stderr
    assert "scripts/system_packages.sh" in message, configure.stderr


def test_the_runtime_builds_launcher_library_exports_its_c_abi(built_runtime):
    """runtime/ builds with hidden symbols by default; its copy of the launcher library
    (the one et_trt_backend.kernels.launcher finds first in a checkout) still exports the C ABI."""
    shared = built_runtime / "kernels" / "libet_trt_grouped_mm.so"
    exported = subprocess.run(["nm", "-D", "--defined-only", shared], capture_output=True, text=True,
                              check=True).stdout
    for symbol in ("et_trt_grouped_mm_create", "et_trt_grouped_mm_launch", "et_trt_grouped_mm_last_kernel",
                   "et_trt_grouped_mm_last_quantize", "et_trt_grouped_mm_destroy"):
        assert symbol in exported, f"{shared} does not export {symbol}"


# ---- the delegate in ExecuTorch's Python runtime --------------------------------------------------
def test_load_registers_the_backend(built_runtime, example_pte):
    from executorch.runtime import Runtime

    runtime.load()
    assert BACKEND_ID in Runtime.get().backend_registry.registered_backend_names
    assert runtime.load() is runtime.load()  # loading again is a no-op
    # Torch-TensorRT's ExecuTorch runtime registers "TensorRTBackend" (FACTS.md); ours must
    # differ, or a process could not hold both.
    assert BACKEND_ID != "TensorRTBackend"
    assert all(d.backend_id == BACKEND_ID for d in read_delegates(example_pte.read_bytes()))


def test_load_from_a_path_serves_a_later_load(built_runtime, monkeypatch, tmp_path):
    """load(PATH), then load() (as load_program and verify_data_file call it) with no library at the default path:
    the library already loaded serves it (issue 35: it failed with "...libet_trt_runtime.so does not exist")."""
    monkeypatch.setattr(runtime, "_loaded", None)
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(tmp_path / "none" / runtime.LIBRARY_NAME))
    loaded = runtime.load(built_runtime / runtime.LIBRARY_NAME)
    assert runtime.load() is loaded


def test_load_names_the_fix_when_the_library_is_missing(tmp_path):
    with pytest.raises(runtime.RuntimeLoadError, match="scripts/build_runtime.sh"):
        runtime.load(tmp_path / "libet_trt_runtime.so")


def test_example_pte_holds_verified_blobs(example_pte):
    blobs = damaged_pte.blobs(example_pte.read_bytes())
    assert blobs, "the example .pte has no et-trt delegate"
    parts = {deserialize(blob).part for blob in blobs}
    assert {"velocity", "decoder"} <= {p.split(".")[0] for p in parts}, parts


def test_python_runtime_refuses_example_without_tensorrt(built_runtime, example_pte, capfd):
    from executorch.runtime import Runtime

    runtime.load()
    program = Runtime.get().load_program(example_pte)
    with pytest.raises(Exception):
        program.load_method("forward")
    err = capfd.readouterr().err
    assert f"{BACKEND_ID}: cannot initialize part" in err, err[-3000:]
    assert NOT_BUILT in err, err[-3000:]


def test_runner_refuses_example_without_tensorrt(built_runtime, example_pte):
    result = run_process([RUNNER, example_pte, "--iterations", "1"])
    assert result.returncode == 1
    assert "cannot load method 'forward'" in result.stderr, result.stderr[-3000:]
    # A source build's library names the source build's way to build TensorRT in (a wheel's, pip's: test_packaging).
    assert f"{NOT_BUILT}: rebuild runtime/ with TensorRT's headers: scripts/build_runtime.sh " \
        "-DET_TRT_TENSORRT_INCLUDE_DIR=<dir with NvInfer.h and NvOnnxParser.h>" in joined_log(result.stderr), \
        result.stderr[-3000:]


# ---- the runner on a plain CPU program (no delegate) ----------------------------------------------
class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x, scale):
        return torch.relu(self.fc(x)) * scale, x.sum(dim=-1)


@pytest.fixture(scope="module")
def cpu_pte(tmp_path_factory) -> tuple[pathlib.Path, torch.nn.Module]:
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = _Mlp().eval()
    ep = torch.export.export(model, (torch.randn(3, 6), torch.randn(3, 1)))
    path = tmp_path_factory.mktemp("cpu") / "mlp.pte"
    path.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
    return path, model


def test_runner_outputs_match_pytorch(built_runtime, cpu_pte, tmp_path):
    path, model = cpu_pte
    x, scale = torch.randn(3, 6), torch.randn(3, 1)
    np.save(tmp_path / "x.npy", x.numpy())
    scale.numpy().tofile(tmp_path / "scale.bin")  # raw bytes in the method's dtype
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for i in range(2):  # poison: stale files must be overwritten
        np.save(out_dir / f"output_{i}.npy", np.full((1,), np.nan, np.float32))
    result = run_process([RUNNER, path, "--input", tmp_path / "x.npy", "--input", f"1={tmp_path / 'scale.bin'}",
                          "--warmup", "1", "--iterations", "7", "--save-outputs", out_dir])
    assert result.returncode == 0, result.stderr
    expected = [t.detach().double().numpy() for t in model(x, scale)]
    for i, want in enumerate(expected):
        got = np.load(out_dir / f"output_{i}.npy")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert re.search(r"^first call +1 +[\d.]+ +- +- +-\nafter 1 warm-up call +7( +[\d.]+){4}$", result.stdout, re.M)
    assert "output 0: fp32[3, 4]" in result.stdout


def test_runner_random_inputs_follow_the_seed(built_runtime, cpu_pte, tmp_path):
    path, _ = cpu_pte
    outs = []
    for run, seed in enumerate((5, 5, 6)):
        d = tmp_path / str(run)
        d.mkdir()
        result = run_process([RUNNER, path, "--seed", seed, "--iterations", "1", "--save-outputs", d])
        assert result.returncode == 0, result.stderr
        outs.append(np.load(d / "output_1.npy"))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "act"], "no method 'act' in {pte} (it has: forward)"),
        (["--input", "7=x.npy"], "--input 7=x.npy: method 'forward' has 2 inputs"),
        (["--input", "{npy_wrong_rank}"], "has rank 1, the method's input has rank 2"),
        (["--input", "{npy_wrong_dtype}"], "dtype int64, the method's input is fp32"),
        (["--input", "{raw_short}"], "raw file holds 8 bytes, the input fp32[3, 6] needs 72"),
        (["--iterations", "0"], "--iterations 0: expected an integer >= 1"),
    ],
)
def test_runner_error_paths(built_runtime, cpu_pte, tmp_path, args, message):
    path, _ = cpu_pte
    files = {
        "npy_wrong_rank": tmp_path / "r.npy",
        "npy_wrong_dtype": tmp_path / "d.npy",
        "raw_short": tmp_path / "s.bin",
    }
    np.save(files["npy_wrong_rank"], np.zeros(18, np.float32))
    np.save(files["npy_wrong_dtype"], np.zeros((3, 6), np.int64))
    files["raw_short"].write_bytes(bytes(8))
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    result = run_process([RUNNER, path, *args])
    assert result.returncode == 1
    assert message.format(pte=path) in result.stderr, result.stderr


def test_runner_missing_model(built_runtime, tmp_path):
    result = run_process([RUNNER, tmp_path / "none.pte"])
    assert result.returncode == 1
    assert f"cannot open model {tmp_path / 'none.pte'}" in result.stderr


def test_runner_refuses_a_corrupted_blob_in_a_pte(built_runtime, example_pte, tmp_path):
    """A .pte whose delegate blob was damaged after export: init refuses it as InvalidProgram."""
    data = bytearray(example_pte.read_bytes())
    blob = damaged_pte.blobs(bytes(data))[0]
    at = bytes(data).find(blob)
    assert at >= 0
    data[at + len(blob) // 2] ^= 0x40
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))
    result = run_process([RUNNER, bad, "--iterations", "1"])
    assert result.returncode == 1
    assert "refusing delegate blob: blob checksum mismatch" in result.stderr, result.stderr[-3000:]


# ---- the TensorRT layer, compiled against TensorRT's public headers --------------------------------
@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("ET_TRT_TENSORRT_INCLUDE_DIR"),
    reason="set ET_TRT_TENSORRT_INCLUDE_DIR to TensorRT's include/ (NvInfer.h, NvOnnxParser.h) to compile the "
    "TensorRT layer; TensorRT's headers are in no package here (runtime/README.md)",
)
def test_tensorrt_layer_builds_and_reports_missing_libnvinfer(tmp_path, example_pte):
    """Compiles and links the TensorRT layer and the GroupedMM plugin against the headers; where
    libnvinfer is absent, init says so (dlopen at init, not at load)."""
    import executorch

    build = tmp_path / "build"
    configure = run_process([pathlib.Path(sys.executable).parent / "cmake", "-S", REPO / "runtime", "-B", build,
                             f"-DCMAKE_PREFIX_PATH={list(executorch.__path__)[0]}",
                             f"-DPython3_EXECUTABLE={sys.executable}",
                             f"-DET_TRT_TENSORRT_INCLUDE_DIR={os.environ['ET_TRT_TENSORRT_INCLUDE_DIR']}",
                             "-DET_TRT_BUILD_TESTS=OFF"])
    assert "et-trt: TensorRT support ON" in configure.stdout, configure.stdout + configure.stderr
    compiled = run_process([pathlib.Path(sys.executable).parent / "cmake", "--build", build, "-j2"])
    assert compiled.returncode == 0, compiled.stdout[-6000:] + compiled.stderr[-3000:]
    result = run_process([build / "et_trt_runner", example_pte, "--iterations", "1"])
    assert result.returncode == 1
    assert "TensorRT is not installed here: cannot load libnvinfer.so." in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("kind", damaged_pte.KINDS)
def test_runner_refuses_a_damaged_file_in_one_line(built_runtime, example_pte, tmp_path, kind):
    path = tmp_path / f"{kind}.pte"
    path.write_bytes(damaged_pte.damaged(example_pte.read_bytes(), kind, seed=random.randrange(1 << 30)))
    result = run_process([RUNNER, path, "--iterations", "1"])
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])  # refused, not a crash
    ours = [line for line in result.stderr.splitlines() if line.startswith("et_trt_runner:")]
    assert len(ours) == 1, result.stderr
    assert ours[0].startswith(f"et_trt_runner: {path} is not a valid ExecuTorch program (truncated or corrupted?")


def test_runner_names_an_unknown_option(built_runtime, example_pte):
    for args in (["--bogus"], ["--bogus", "1"]):
        result = run_process([RUNNER, example_pte, *args])
        assert result.returncode == 1 and result.stderr.startswith("et_trt_runner: unknown option --bogus\n")


def test_python_runtime_survives_a_part_name_that_is_not_utf8(built_runtime, example_pte, tmp_path):
    """A checksum-valid blob whose part name is not UTF-8: refused at init, and no raw bytes reach
    ExecuTorch's Python log sink (which throws on them and aborts the process)."""

    data = bytearray(example_pte.read_bytes())
    blob = damaged_pte.blobs(bytes(data))[0]
    part = deserialize(blob).part.encode()
    stored = struct.pack("<I", len(part)) + part + b"\0"  # a flatbuffer string
    assert blob.count(stored) == 1
    bad_blob = damaged_pte.reseal(blob.replace(stored, stored[:4] + b"\xff" + stored[5:]))
    at = bytes(data).find(blob)
    data[at:at + len(blob)] = bad_blob
    bad = tmp_path / "bad_part.pte"
    bad.write_bytes(bytes(data))
    result = load_method_refused(bad)
    assert "blob field part is not UTF-8 text" in result.stderr, result.stderr[-3000:]


# Multi-byte characters at every offset from the delegate's 200-byte line cuts: 2-, 3- and 4-byte ones.
LONG_PART_NAMES = ["a" * lead + wide * (300 // len(wide.encode())) for wide in ("é", "€", "🤖")
                   for lead in range(len(wide.encode()))] + ["a" + "é" * 100]


def test_python_runtime_survives_long_non_ascii_log_lines(built_runtime, example_pte):
    """Issue 34's abort reproducer: the delegate's refusal names a part of multi-byte text, longer than one log
    line, with characters across every cut offset. ExecuTorch's Python log sink throws on a line that is not
    UTF-8, which aborts the process: each load must end in a Python exception, in a child process that exits
    cleanly, its log whole UTF-8 with every name intact."""
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from support import damaged_pte\n"
        "from executorch.runtime import Runtime\n"
        "from et_trt_backend import runtime\n"
        "runtime.load()\n"
        f"base = open({str(example_pte)!r}, 'rb').read()\n"
        f"for part in {LONG_PART_NAMES!r}:\n"
        "    program = Runtime.get().load_program(damaged_pte.with_part_name(base, part))\n"
        "    try:\n"
        "        program.load_method('forward')\n"
        "    except RuntimeError:\n"
        "        print('refused', flush=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=600)
    stderr = result.stderr.decode()  # strict: a line cut inside a character fails here
    assert result.returncode == 0, (result.returncode, stderr[-3000:])
    assert result.stdout.decode().split() == ["refused"] * len(LONG_PART_NAMES)
    log = joined_log(stderr)
    for part in LONG_PART_NAMES:
        assert f"refusing delegate blob: part '{part}': " in log, log[-3000:]
