"""The setup's system-package step, run with stand-in apt-get / sudo / id / dpkg on PATH.

CI's machine already has the packages, so the branch that installs them would
never run there; these tests run it for real against stand-ins that record how
they were called (root without sudo, a user through sudo, nothing when present,
dpkg told about arm64 before apt-get update lists its packages).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import platform
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "system_packages.sh"
HOST_LIB = f"usr/lib/{platform.machine()}-linux-gnu"
ARM64_LIB = "usr/lib/aarch64-linux-gnu"
HOST_PACKAGES = "flatbuffers-compiler libflatbuffers-dev libgtest-dev zlib1g-dev libssl-dev ccache"
# The aarch64 cross build and its tests under qemu, installed on x86-64 machines only.
CROSS_PACKAGES = "g++-aarch64-linux-gnu qemu-user zlib1g-dev:arm64 libssl-dev:arm64 libgtest-dev:arm64 " \
    "libstdc++6:arm64 libasan8:arm64 libubsan1:arm64"
X86_64 = platform.machine() == "x86_64"
PACKAGES = f"{HOST_PACKAGES} {CROSS_PACKAGES}" if X86_64 else HOST_PACKAGES
x86_64_only = pytest.mark.skipif(not X86_64, reason="the aarch64 cross toolchain is installed on x86-64 machines only")


def _stand_in(folder: pathlib.Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run(tmp_path: pathlib.Path, uid: int, system_root: str, foreign_archs: str = "") -> tuple[
        subprocess.CompletedProcess, list[str]]:
    """Runs the step with stand-ins first on PATH; returns the result and the recorded calls.
    foreign_archs: what the stand-in dpkg says it knows besides this machine's architecture."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stand_in(bin_dir, "apt-get", f'echo "apt-get DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {calls}\n')
    _stand_in(bin_dir, "sudo", f'echo "sudo $*" >> {calls}\nexec "$@"\n')
    _stand_in(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || /usr/bin/id "$@"\n')
    _stand_in(bin_dir, "dpkg", f'if [ "$1" = --print-foreign-architectures ]; then printf "{foreign_archs}"; '
              f'else echo "dpkg $*" >> {calls}; fi\n')
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "ET_TRT_SYSTEM_ROOT": system_root}
    env.pop("DEBIAN_FRONTEND", None)
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return result, calls.read_text().splitlines() if calls.exists() else []


def _root_with(tmp_path: pathlib.Path, *files: str) -> pathlib.Path:
    """A system root holding these (empty) files, executable where they are programs."""
    root = tmp_path / "root"
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        path.chmod(0o755)
    return root


HOST_FILES = ("usr/bin/flatc", "usr/include/flatbuffers/flatbuffers.h", f"{HOST_LIB}/libgtest.a",
              f"{HOST_LIB}/libz.so", f"{HOST_LIB}/libcrypto.so", "usr/bin/ccache")


def test_as_root_apt_get_runs_directly(tmp_path):
    result, calls = _run(tmp_path, uid=0, system_root=str(tmp_path / "empty_root"))
    assert result.returncode == 0, result.stderr
    assert calls == (["dpkg --add-architecture arm64"] if X86_64 else []) + [
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        f"apt-get DEBIAN_FRONTEND=noninteractive install -y -q {PACKAGES}",
    ]
    assert f"installing system packages: {PACKAGES}" in result.stdout


def test_as_a_user_apt_get_runs_through_sudo(tmp_path):
    result, calls = _run(tmp_path, uid=1000, system_root=str(tmp_path / "empty_root"))
    assert result.returncode == 0, result.stderr
    assert calls == (["sudo dpkg --add-architecture arm64", "dpkg --add-architecture arm64"] if X86_64 else []) + [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q",
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        f"sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q {PACKAGES}",
        f"apt-get DEBIAN_FRONTEND=noninteractive install -y -q {PACKAGES}",
    ]


def test_only_missing_packages_are_installed(tmp_path):
    root = _root_with(tmp_path, f"{HOST_LIB}/libgtest.a", f"{HOST_LIB}/libz.so", "usr/bin/qemu-aarch64",
                      f"{ARM64_LIB}/libgtest.a", f"{ARM64_LIB}/libasan.so.8")
    result, calls = _run(tmp_path, uid=0, system_root=str(root), foreign_archs="arm64\n")
    assert result.returncode == 0, result.stderr
    cross = " g++-aarch64-linux-gnu zlib1g-dev:arm64 libssl-dev:arm64 libstdc++6:arm64 libubsan1:arm64"
    assert calls[-1] == "apt-get DEBIAN_FRONTEND=noninteractive install -y -q flatbuffers-compiler " \
        "libflatbuffers-dev libssl-dev ccache" + (cross if X86_64 else "")
    assert not any(call.startswith("dpkg") for call in calls)  # dpkg knows arm64 already


def test_headers_of_the_arm64_packages_alone_do_not_count(tmp_path):
    """libgtest-dev:arm64 and zlib1g-dev:arm64 put the headers in /usr/include, which every
    architecture's package shares: this machine's packages are still missing."""
    root = _root_with(tmp_path, "usr/bin/flatc", "usr/include/flatbuffers/flatbuffers.h", "usr/include/gtest/gtest.h",
                      "usr/include/zlib.h", "usr/include/openssl/evp.h", f"{ARM64_LIB}/libgtest.a",
                      f"{ARM64_LIB}/libz.so", f"{ARM64_LIB}/libcrypto.so")
    result, calls = _run(tmp_path, uid=0, system_root=str(root), foreign_archs="arm64\n")
    assert result.returncode == 0, result.stderr
    assert calls[-1].startswith("apt-get DEBIAN_FRONTEND=noninteractive install -y -q libgtest-dev zlib1g-dev "
                                "libssl-dev ccache")


@x86_64_only
def test_arm64_is_added_to_dpkg_before_apt_get_update(tmp_path):
    root = _root_with(tmp_path, *HOST_FILES, "usr/bin/aarch64-linux-gnu-g++", "usr/bin/qemu-aarch64")
    result, calls = _run(tmp_path, uid=0, system_root=str(root), foreign_archs="i386\n")
    assert result.returncode == 0, result.stderr
    assert calls == [
        "dpkg --add-architecture arm64",
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        "apt-get DEBIAN_FRONTEND=noninteractive install -y -q zlib1g-dev:arm64 libssl-dev:arm64 libgtest-dev:arm64 "
        "libstdc++6:arm64 libasan8:arm64 libubsan1:arm64",
    ]
    assert "adding the arm64 architecture to dpkg" in result.stdout


@x86_64_only
def test_the_cross_tools_alone_need_no_arm64_architecture(tmp_path):
    root = _root_with(tmp_path, *HOST_FILES, *(f"{ARM64_LIB}/{lib}" for lib in (
        "libz.so", "libcrypto.so", "libgtest.a", "libstdc++.so.6", "libasan.so.8", "libubsan.so.1")))
    result, calls = _run(tmp_path, uid=0, system_root=str(root))
    assert result.returncode == 0, result.stderr
    assert calls == [
        "apt-get DEBIAN_FRONTEND=noninteractive update -q",
        "apt-get DEBIAN_FRONTEND=noninteractive install -y -q g++-aarch64-linux-gnu qemu-user",
    ]


@pytest.mark.skipif(not all(pathlib.Path("/", f).exists() for f in HOST_FILES), reason="this machine lacks the packages")
@pytest.mark.skipif(X86_64 and not pathlib.Path("/usr/bin/aarch64-linux-gnu-g++").exists(),
                    reason="this machine lacks the aarch64 cross toolchain")
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


# ---- the runtime build's targets (scripts/build_runtime.sh) ----
BUILD_SCRIPT = REPO / "scripts" / "build_runtime.sh"


def test_build_refuses_an_unknown_target_naming_the_supported_ones():
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "--target", "riscv"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr == "build_runtime.sh: --target riscv is not supported; use one of: host, aarch64\n"


@x86_64_only
def test_aarch64_build_without_the_cross_compiler_names_the_fix(tmp_path):
    bin_dir = tmp_path / "bin"  # the tools the script needs before it looks for the cross compiler, and no more
    bin_dir.mkdir()
    for tool in ("dirname", "uname"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    result = subprocess.run(["/bin/bash", str(BUILD_SCRIPT), "--target", "aarch64"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PATH": str(bin_dir)})
    assert result.returncode == 1
    assert "--target aarch64 needs the cross compiler aarch64-linux-gnu-g++" in result.stderr
    assert "./scripts/system_packages.sh installs them" in result.stderr


# ---- the compiler cache (scripts/compiler_cache.sh, sourced by setup.sh and test.sh) ----
CACHE_VARIABLES = ("CMAKE_C_COMPILER_LAUNCHER", "CMAKE_CXX_COMPILER_LAUNCHER", "CCACHE_BASEDIR", "CCACHE_NOHASHDIR")


def _cache_environment(tmp_path: pathlib.Path, with_ccache: bool) -> dict[str, str]:
    """The variables compiler_cache.sh exports, sourced from the checkout with only `command`'s PATH lookups: a
    stand-in ccache on it or none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_ccache:
        _stand_in(bin_dir, "ccache", "exit 0\n")
    script = f'cd {REPO} && source scripts/compiler_cache.sh && for v in {" ".join(CACHE_VARIABLES)}; do ' \
        'printf "%s=%s\\n" "$v" "${!v-unset}"; done'
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES} | {"PATH": str(bin_dir)}
    result = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


def test_builds_compile_through_ccache_where_it_is_installed(tmp_path):
    assert _cache_environment(tmp_path, with_ccache=True) == {
        "CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
        "CCACHE_BASEDIR": str(REPO), "CCACHE_NOHASHDIR": "1"}


def test_builds_compile_directly_without_ccache(tmp_path):
    assert set(_cache_environment(tmp_path, with_ccache=False).values()) == {"unset"}
