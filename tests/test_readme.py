"""The README's Quickstart runs as written, against the bundled example."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from et_trt_backend.serialization.pte import read_partitions

REPO = pathlib.Path(__file__).resolve().parents[1]


def _quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


@pytest.mark.slow
def test_quickstart_exports_the_example(tmp_path):
    # The snippet runs "from the repository root": give it the examples it names, and a
    # working directory of its own for the .pte it writes.
    (tmp_path / "examples").symlink_to(REPO / "examples")
    result = subprocess.run([sys.executable, "-c", _quickstart()], cwd=tmp_path, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    # The report it prints: the example runs whole in TensorRT.
    assert result.stdout.startswith("program 'forward': 2 TensorRT partition(s) of "), result.stdout
    assert result.stdout.rstrip().endswith("; no op left to ExecuTorch"), result.stdout
    partitions = read_partitions((tmp_path / "policy.pte").read_bytes())
    assert sorted(p.contents.part for p in partitions) == ["decoder", "velocity"]
