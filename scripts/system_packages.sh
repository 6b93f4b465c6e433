#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the build needs, where they are missing:
# flatc + flatbuffers headers for the blob schema, gtest for the C++ tests,
# zlib and OpenSSL for the blob's checksum and content id (runtime/), ccache
# for rebuilds (scripts/compiler_cache.sh says which). On an
# x86-64 machine also what cross-builds the runtime for aarch64 (Jetson) and
# runs its tests: the cross compiler, qemu-user, and arm64 libraries through
# Debian's multiarch (dpkg learns the arm64 architecture first).
# apt-get runs directly as root, through sudo otherwise.
# ET_TRT_SYSTEM_ROOT prefixes the paths checked (tests/test_setup.py).
set -euo pipefail
root=${ET_TRT_SYSTEM_ROOT:-}
# A library file, not a header, says whether a package is there for this
# machine: the headers in /usr/include are shared by every architecture's
# package (libgtest-dev:arm64 alone puts /usr/include/gtest in place).
host_lib=$root/usr/lib/$(uname -m)-linux-gnu
arm64_lib=$root/usr/lib/aarch64-linux-gnu

need=()
# /usr/bin/flatc, not any flatc on PATH: the ExecuTorch wheel puts one of another release in a venv.
[ -x "$root/usr/bin/flatc" ] || need+=(flatbuffers-compiler)
[ -f "$root/usr/include/flatbuffers/flatbuffers.h" ] || need+=(libflatbuffers-dev)
[ -f "$host_lib/libgtest.a" ] || need+=(libgtest-dev)
[ -f "$host_lib/libz.so" ] || need+=(zlib1g-dev)
[ -f "$host_lib/libcrypto.so" ] || need+=(libssl-dev)
[ -x "$root/usr/bin/ccache" ] || need+=(ccache)
if [ "$(uname -m)" = x86_64 ]; then
  [ -x "$root/usr/bin/aarch64-linux-gnu-g++" ] || need+=(g++-aarch64-linux-gnu)
  [ -x "$root/usr/bin/qemu-aarch64" ] || need+=(qemu-user)
  # Linked into the aarch64 build, then loaded by its programs under qemu-aarch64.
  [ -f "$arm64_lib/libz.so" ] || need+=(zlib1g-dev:arm64)
  [ -f "$arm64_lib/libcrypto.so" ] || need+=(libssl-dev:arm64)
  [ -f "$arm64_lib/libgtest.a" ] || need+=(libgtest-dev:arm64)
  [ -f "$arm64_lib/libstdc++.so.6" ] || need+=(libstdc++6:arm64)
  [ -f "$arm64_lib/libasan.so.8" ] || need+=(libasan8:arm64)
  [ -f "$arm64_lib/libubsan.so.1" ] || need+=(libubsan1:arm64)
fi
[ ${#need[@]} -gt 0 ] || exit 0

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
# apt-get update lists arm64 packages only once dpkg knows the architecture.
if [[ " ${need[*]}" == *:arm64* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  printf '\n== adding the arm64 architecture to dpkg (multiarch), for the aarch64 libraries\n'
  "${as_root[@]}" dpkg --add-architecture arm64
fi
printf '\n== installing system packages: %s\n' "${need[*]}"
# `env` sets the variable for apt-get whether or not sudo comes first.
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
