#!/usr/bin/env bash
# Runs every test: the C++ runtime's (through ctest, driven by pytest) and
# the Python ones. Needs ./scripts/setup.sh once. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build_runtime.sh >/dev/null
# -ra: the summary lists every skip with its reason (what is missing here and why).
exec .venv/bin/python -m pytest -ra "$@"
