"""benchmarks/moe_sweep.py on the CPU: its tables from the rows a device run makes (contenders that failed
included: the run is one call on a device, a report that raises loses it), and how it splits one profiled session's
kernel records among the contenders that ran in it."""

import types

import pytest
import torch
from support.benchmark_modules import benchmark_module
from torch.autograd import DeviceType

TRITON_KERNELS = "moe_route (e64) + moe_gate_up_gated (large) + moe_down (large) + moe_combine (any)"
WGMMA_KERNELS = ("moe_route (e64) + moe_gather (any) + moe_gate_up_gated (wgmma) + moe_down (wgmma) + "
                 "moe_combine (any)")


@pytest.fixture(scope="module")
def sweep():
    with benchmark_module("moe_sweep") as module:
        yield module


def _row(shape, tokens, experts, size, top_k, us, kernel_us=None):
    return {"shape": shape, "tokens": tokens, "experts": experts, "hidden": size, "ffn": size, "top_k": top_k,
            "rows_per_expert": tokens * top_k / experts, "err": {label: 1e-3 for label in us}, "us": us,
            "x_eager": {label: us["eager"] / t for label, t in us.items()} if "eager" in us else {},
            "kernel_us": kernel_us or {}, "kernels": {}}


def test_tables_pick_the_faster_path_and_name_what_was_not_timed(sweep):
    rows = [
        # 8 experts x 16 rows: the tilings win; the tuned tiling beats the shipped one
        _row("dispatch 64tok 8e h1024", 64, 8, 1024, 2, {"eager": 90.0, "fused_tilings": 40.0,
                                                          "fused_tile_m32_n64_s4_w4": 30.0,
                                                          "fused_wgmma_s4_c2": 80.0, "fused_wgmma_s4_c1": 60.0}),
        # 8 experts x 512 rows: wgmma wins; the shipped wgmma build failed (not timed)
        _row("dispatch 2048tok 8e h1024", 2048, 8, 1024, 2, {"eager": 400.0, "fused_tilings": 300.0,
                                                            "fused_wgmma_s4_c1": 200.0}),
        _row("moe 3500tok 128e h3072 top8", 3500, 128, 3072, 8,
             {"eager": 4700.0, "fused_tilings": 5500.0, "fused_wgmma_s4_c2": 4000.0},
             {"eager": {"void cutlass::device_kernel<GemmUniversal>": 3000.0, "index_add": 500.0},
              "fused_wgmma_s4_c2": {"route": 10.0, "gather": 100.0, "gate_up": 2500.0, "down": 1250.0,
                                    "combine": 140.0}}),
    ]
    text = sweep.report(rows)
    shipped, best, by_rows, moe = text.split("\n\n")
    assert shipped.splitlines()[3].startswith("| 8 | 1024 | 0.50 | - | - | - | - | ")  # 40 / 80; then not timed
    assert "| - | - | - | - | - | - |" not in best and best.splitlines()[3].startswith("| 8 | 1024 | 0.50 |")  # 30 / 60
    assert "| 1.50 |" in best.splitlines()[3]  # 512 rows: 300 / 200
    lines = by_rows.splitlines()[1:]
    assert [line.split("|")[0].strip() for line in lines] == ["128", "4096", "28000"]
    assert lines[1].endswith("| tilings (300) | wgmma_s4_c1 (200) | -, 1.50")
    table = moe.splitlines()
    assert table[0] == "### moe 3500tok 128e h3072 top8 (219 rows per expert; 1.59 TFLOP)"
    assert all(line.count("|") == table[1].count("|") for line in table[1:])
    # 1.06 TFLOP of gate+up in 2.5 ms, 0.53 of down in 1.25 ms; route + gather + combine 250 us
    assert table[3] == "| wgmma_s4_c2 | 4000 | 1.18x | 2500 (423) | 1250 (423) | 250 | 1.0e-03 |"
    assert table[4] == "| eager | 4700 | 1.00x | 3000 (both GEMMs) | - | - | 1.0e-03 |"
    assert table[5].startswith("| tilings | 5500 | 0.85x | - | - | - |")


def test_kernel_records_are_split_by_contender(sweep, monkeypatch):
    """Each contender's records follow a marker kernel; a device record of CUPTI's own before the first marker and
    host records are skipped; a contender whose records do not match its launches gets no kernel times, and the
    others (eager's after it included) still do."""
    records = []

    def launches(names, durations):
        return lambda: records.extend(zip(names, durations))

    fns = {
        "fused_tilings": launches(["moe_route_kernel", "moe_gate_up_kernel", "moe_down_kernel", "moe_combine_kernel"],
                                  [1.0, 100.0, 50.0, 5.0]),
        "fused_wgmma_s4_c2": launches(["moe_route_kernel", "moe_gather_kernel", "grouped_mm_wgmma",
                                       "grouped_mm_wgmma", "moe_combine_kernel"], [1.0, 3.0, 80.0, 40.0, 5.0]),
        "fused_broken": launches(["moe_route_kernel", "moe_combine_kernel"], [1.0, 2.0]),  # says 4 kernels, runs 2
        "eager": launches(["gemm", "index_add", "gemm"], [10.0, 2.0, 20.0]),
    }
    contenders = {"eager": (None, False)}
    for label, kernels in (("fused_tilings", TRITON_KERNELS), ("fused_wgmma_s4_c2", WGMMA_KERNELS),
                           ("fused_broken", TRITON_KERNELS)):
        contenders[label] = (types.SimpleNamespace(launcher=types.SimpleNamespace(last_kernels=kernels)), True)

    class Session:
        def __enter__(self):
            records.clear()
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            def event(name, start, us, device=DeviceType.CUDA):
                return types.SimpleNamespace(name=name, device_type=device, time_range=types.SimpleNamespace(
                    start=start, elapsed_us=lambda: us))

            return [event("cuLaunchKernel", 0.5, 9.0, DeviceType.CPU), event("Activity Buffer Request", -1.0, 0.0),
                    *(event(name, float(i), us) for i, (name, us) in enumerate(records))]

    monkeypatch.setattr(sweep, "profile", lambda activities: Session())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: records.append(("void at::cuda::spin_kernel(long)", 1.0)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    times = sweep.kernel_times(fns, contenders)
    assert times["fused_tilings"] == {"route": 1.0, "gate_up": 100.0, "down": 50.0, "combine": 5.0}
    assert times["fused_wgmma_s4_c2"] == {"route": 1.0, "gather": 3.0, "gate_up": 80.0, "down": 40.0,
                                          "combine": 5.0}
    assert "fused_broken" not in times
    assert times["eager"] == {"gemm": 30.0, "index_add": 2.0}
