"""Sustained runs with the GPU's SM clock and power draw sampled alongside.

The H200 runs the large MoE GEMMs at its power cap (~700 W), so a kernel's speed there
is its energy per product: at the cap, the clock settles where the power draw is at the
limit. Running each contender alone for a few seconds and sampling nvidia-smi shows
this directly (the clock each one settles at, and joules per TFLOP) and gives a second,
steady-state figure next to the interleaved timing of grouped_mm_bench.py.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

import torch

WARM_UP_S = 1.0  # the clock needs a few hundred ms to settle after a change of load


class GpuSampler:
    """nvidia-smi sampling SM clock (MHz) and power (W) every 50 ms, as (time, watts, mhz)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._process: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def start(self) -> GpuSampler:
        self._process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=power.draw,clocks.sm", "--format=csv,noheader,nounits", "-lms", "50", "-i",
             str(torch.cuda.current_device())],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            try:
                watts, mhz = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]" on boards without a power sensor
                continue
            self.samples.append((time.monotonic(), watts, mhz))

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()
        self._thread.join(timeout=5)

    def between(self, start: float, end: float) -> tuple[float, float, int]:
        """Median power and clock of the samples taken in [start, end], and how many there were."""
        window = [(w, m) for t, w, m in self.samples if start <= t <= end]
        if not window:
            return float("nan"), float("nan"), 0
        return statistics.median(w for w, _ in window), statistics.median(m for _, m in window), len(window)


def run(graph: torch.cuda.CUDAGraph, calls: int, seconds: float, sampler: GpuSampler) -> dict:
    """Replays `graph` (of `calls` calls) back to back for WARM_UP_S + `seconds`; seconds per call over
    the part after the warm-up, with that part's median power and SM clock."""
    deadline = time.monotonic() + WARM_UP_S
    while time.monotonic() < deadline:
        graph.replay()
        torch.cuda.synchronize()
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.monotonic()
    start_event.record()
    replays = 0
    while time.monotonic() - start < seconds:
        graph.replay()
        replays += 1
        if replays % 4 == 0:  # keep the queue short, so the loop's end is the GPU's end
            torch.cuda.synchronize()
    end_event.record()
    end_event.synchronize()
    watts, mhz, samples = sampler.between(start, time.monotonic())
    return {"s_per_call": start_event.elapsed_time(end_event) / 1e3 / (replays * calls), "watts": watts,
            "sm_mhz": mhz, "samples": samples}
