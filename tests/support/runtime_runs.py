"""The C++ runtime in processes of their own: et_trt_runner, ExecuTorch's Python runtime with the
delegate loaded, and their log lines joined back into messages."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = REPO / "runtime" / "build"
RUNNER = BUILD / "et_trt_runner"
NOT_BUILT = "TensorRT support was not built into libet_trt_runtime.so"


def joined_log(stderr: str) -> str:
    """ExecuTorch's log lines (the runner's and the Python runtime's) joined back into messages: the
    delegate splits long ones into "  ..." continuation lines."""
    text = ""
    for line in stderr.splitlines():
        message = re.sub(r"^(?:[EIWD] [0-9:.]+ executorch:|\[)[\w.]+:\d+\] ", "", line)
        text += message[5:] if message.startswith("  ...") else "\n" + message
    return text


def run_process(args: list, **kwargs) -> subprocess.CompletedProcess:
    """`args` run to completion (10 minutes at most), stdout and stderr captured as text."""
    # errors="replace": ExecuTorch logs a bad file's identifier bytes as they are.
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", timeout=600,
                          **kwargs)


def load_method_refused(pte: pathlib.Path, ptd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """Loads `pte` (with the data file `ptd`) through ExecuTorch's Python runtime in a fresh process and
    asserts that its method is refused with an exception, not by a crash."""
    script = (
        "import sys\n"
        "from executorch.runtime import Runtime\n"
        "from et_trt_backend import runtime\n"
        "runtime.load()\n"
        f"program = Runtime.get().load_program({str(pte)!r}, data_path={str(ptd) if ptd else None!r})\n"
        "try:\n"
        "    program.load_method('forward')\n"
        "except Exception:\n"
        "    sys.exit(3)\n"
    )
    result = run_process([sys.executable, "-c", script])
    assert result.returncode == 3, (result.returncode, result.stderr[-3000:])  # refused, not crashed
    return result
