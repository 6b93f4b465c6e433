"""A ctest check of et_trt_runner: runs a command and checks its exit status and output.

    check_runner.py --exit N --expect REGEX [--expect REGEX...] --needs FILE -- COMMAND...

COMMAND is the runner, after the cross-compiling emulator where there is one
(ctest adds none to a command that is not a target). Each REGEX must match a
line of the command's output (stdout and stderr). Exits 77 (the test's
SKIP_RETURN_CODE) when FILE is missing.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int, required=True, help="the exit status the command must have")
    parser.add_argument("--expect", action="append", required=True, help="a regex a line of the output must match")
    parser.add_argument("--needs", type=pathlib.Path, required=True, help="the model the command runs")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    if not args.needs.exists():
        print(f"skipped: no {args.needs} (make_test_blobs.py links the example .pte when ./scripts/setup.sh "
              "has exported out/moe_policy.pte)")
        return 77
    result = subprocess.run(args.command, capture_output=True, text=True, errors="replace", timeout=600)
    output = result.stdout + result.stderr
    print(output)
    problems = [f"exit status {result.returncode}, expected {args.exit}"] if result.returncode != args.exit else []
    problems += [f"no line matches {regex!r}" for regex in args.expect if not re.search(regex, output, re.M)]
    for problem in problems:
        print(f"check_runner.py: {' '.join(args.command)}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
