"""The table of benchmarks/device/moe_plugin_run.sh: per form (fused MoEExperts blocks, GroupedMM blocks, fused with FP8
experts) and token count, the output's error against the float32 policy (largest absolute difference over the
reference's largest magnitude; bf16 math gives about 1e-2), the form against the GroupedMM form, and et_trt_runner's
latencies.

    python benchmarks/device/plugin_run_table.py OUT RUN TOKENS...
"""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np

FORMS = ("fused", "grouped", "fp8")
# Of the reference's largest magnitude: two bf16 MoE layers and attention, float32 accumulation. FP8 experts add
# their weights' and activations' e4m3 rounding (the policy output's norm-wise error against bf16 was 1.2e-2 on the
# CPU, tests/test_lowering_fp8.py); this largest-element bound for them is a guess, not yet measured on a device.
TOLERANCE = {"fused": 3e-2, "grouped": 3e-2, "fp8": 1e-1}
_LATENCY = re.compile(r"^(first call|after \d+ warm-up calls?)\s+(\d+)\s+([\d.]+)\s+([\d.-]+)", re.M)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


def latencies(log: pathlib.Path) -> tuple[str, str, str]:
    """(first call, median, p99) in ms as the runner printed them, "-" where it did not."""
    rows = {m.group(1).split()[0]: m for m in _LATENCY.finditer(log.read_text(errors="replace"))} if log.exists() \
        else {}
    first = rows["first"].group(3) if "first" in rows else "-"
    timed = rows.get("after")
    return first, timed.group(3) if timed else "-", timed.group(4) if timed else "-"


def main(out: pathlib.Path, run: pathlib.Path, tokens: list[int]) -> int:
    print("| form | tokens | error vs float32 | vs GroupedMM | first call (ms: builds or loads the engine) | "
          "median (ms) | p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for count in tokens:
        reference = np.load(run / f"t{count}_reference.npy")
        outputs = {form: out / f"{form}_t{count}" / "output_0.npy" for form in FORMS}
        got = {form: np.load(path) for form, path in outputs.items() if path.exists()}
        for form in FORMS:
            between = relative_error(got[form], got["grouped"]) if form in got and "grouped" in got else float("nan")
            error = relative_error(got[form], reference) if form in got else float("nan")
            failed |= not error <= TOLERANCE[form]
            first, median, p99 = latencies(out / f"{form}_t{count}.log")
            print(f"| {form} | {count} | {error:.2e} | {between:.2e} | {first} | {median} | {p99} |")
    print(f"outputs within {', '.join(f'{t:g} ({f})' for f, t in TOLERANCE.items())} of the float32 policy: "
          f"{'no' if failed else 'yes'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), [int(t) for t in sys.argv[3:]]))
