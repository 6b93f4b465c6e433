#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the build needs, where they are missing:
# flatc + flatbuffers headers for the blob schema, gtest for the C++ tests,
# zlib and OpenSSL for the blob's checksum and content id (runtime/).
# apt-get runs directly as root, through sudo otherwise.
# ET_TRT_SYSTEM_ROOT prefixes the paths checked (tests/test_setup.py).
set -euo pipefail
root=${ET_TRT_SYSTEM_ROOT:-}

need=()
# /usr/bin/flatc, not any flatc on PATH: the ExecuTorch wheel puts one of another release in a venv.
[ -x "$root/usr/bin/flatc" ] || need+=(flatbuffers-compiler)
[ -f "$root/usr/include/flatbuffers/flatbuffers.h" ] || need+=(libflatbuffers-dev)
[ -d "$root/usr/include/gtest" ] || need+=(libgtest-dev)
[ -f "$root/usr/include/zlib.h" ] || need+=(zlib1g-dev)
[ -f "$root/usr/include/openssl/evp.h" ] || need+=(libssl-dev)
[ ${#need[@]} -gt 0 ] || exit 0

printf '\n== installing system packages: %s\n' "${need[*]}"
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
# `env` sets the variable for apt-get whether or not sudo comes first.
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
