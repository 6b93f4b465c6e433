"""Importing a benchmark script (benchmarks/<name>.py) in a CPU test of its report: its siblings import each other
as top-level modules, so benchmarks/ is on sys.path while the test uses it."""

import contextlib
import importlib
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_module(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
