"""The setup's system-package step, run with stand-in apt-get / sudo / id on PATH.

CI's machine already has the packages, so the branch that installs them would
never run there; these tests run it for real against stand-ins that record how
they were called (root without sudo, a user through sudo, nothing when present).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "system_packages.sh"
PACKAGES = "flatbuffers-compiler libflatbuffers-dev libgtest-dev zlib1g-dev libssl-dev"


def _stand_in(folder: pathlib.Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run(tmp_path: pathlib.Path, uid: int, system_root: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs the step with stand-ins first on PATH; returns the result and the recorded calls."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stand_in(bin_dir, "apt-get", f'echo "apt-get DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {calls}\n')
    _stand_in(bin_dir, "sudo", f'echo "sudo $*" >> {calls}\nexec "$@"\n')
    _stand_in(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || /usr/bin/id "$@"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "ET_TRT_SYSTEM_ROOT": system_root}
    env.pop("DEBIAN_FRONTEND", None)
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_as_root_apt_get_runs_directly(tmp_path):
    result, calls = _run(tmp_path, uid=0, system_root=str(tmp_path / "empty_root"))
    assert result.returncode == 0, result.stderr
    assert calls == [
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        f"apt-get DEBIAN_FRONTEND=noninteractive install -y -q {PACKAGES}",
    ]
    assert f"installing system packages: {PACKAGES}" in result.stdout


def test_as_a_user_apt_get_runs_through_sudo(tmp_path):
    result, calls = _run(tmp_path, uid=1000, system_root=str(tmp_path / "empty_root"))
    assert result.returncode == 0, result.stderr
    assert calls == [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q",
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        f"sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q {PACKAGES}",
        f"apt-get DEBIAN_FRONTEND=noninteractive install -y -q {PACKAGES}",
    ]


def test_only_missing_packages_are_installed(tmp_path):
    root = tmp_path / "root"
    (root / "usr" / "include" / "gtest").mkdir(parents=True)
    (root / "usr" / "include" / "zlib.h").write_text("")
    result, calls = _run(tmp_path, uid=0, system_root=str(root))
    assert result.returncode == 0, result.stderr
    assert calls[-1] == "apt-get DEBIAN_FRONTEND=noninteractive install -y -q flatbuffers-compiler " \
        "libflatbuffers-dev libssl-dev"


@pytest.mark.skipif(not pathlib.Path("/usr/include/gtest").is_dir(), reason="this machine lacks the packages")
def test_nothing_runs_where_the_packages_are_installed(tmp_path):
    result, calls = _run(tmp_path, uid=0, system_root="")
    assert result.returncode == 0 and calls == [] and result.stdout == ""


# ---- the TensorRT for RTX wheel's missing unversioned library (scripts/link_tensorrt_rtx.sh) ----
LINK_SCRIPT = REPO / "scripts" / "link_tensorrt_rtx.sh"


def _link(lib_dir: pathlib.Path | None) -> subprocess.CompletedProcess:
    args = ["bash", str(LINK_SCRIPT)] + ([str(lib_dir)] if lib_dir is not None else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_rtx_link_is_created_beside_the_versioned_library(tmp_path):
    (tmp_path / "libtensorrt_rtx.so.1").write_bytes(b"\x7fELF")
    result = _link(tmp_path)
    assert result.returncode == 0, result.stderr
    link = tmp_path / "libtensorrt_rtx.so"
    assert link.is_symlink() and os.readlink(link) == "libtensorrt_rtx.so.1"  # relative: the folder may move
    assert f"linked {link} -> libtensorrt_rtx.so.1" in result.stdout
    again = _link(tmp_path)  # idempotent
    assert again.returncode == 0 and again.stdout == "" and os.readlink(link) == "libtensorrt_rtx.so.1"


def test_rtx_link_does_nothing_where_tensorrt_rtx_is_absent(tmp_path):
    result = _link(tmp_path)
    assert result.returncode == 0 and "TensorRT for RTX is not installed; nothing to link" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_rtx_link_of_the_installed_wheel():
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None:
        pytest.skip("TensorRT for RTX is not installed (the tensorrt-rtx extra)")
    result = _link(None)
    assert result.returncode == 0, result.stderr
    folder = pathlib.Path(spec.origin).parent
    assert (folder / "libtensorrt_rtx.so").resolve() == (folder / "libtensorrt_rtx.so.1").resolve()
