"""benchmarks/moe_block_bench.py's report on the CPU: its table and goal lines from the rows a device run makes, a
contender that failed or was not timed included (the run is one call on a device: a report that raises loses it)."""

import math

import pytest
from support.benchmark_modules import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("moe_block_bench") as module:
        yield module


def _row(shape, tokens, us, x, launches, err, kernels=None, **more):
    return {"shape": shape, "tokens": tokens, "us": us, "x": x, "launches": launches, "err": err,
            "kernels": kernels or {}, **more}


def test_table_and_goals_name_what_was_not_timed(bench):
    rows = [
        _row("3500tok", 3500, {"eager": 3400.0, "unfused": 3600.0, "fused": 2700.0},
             {"fused": {"eager": 1.26, "unfused": 1.33}}, {"eager": 40, "unfused": 30, "fused": 5},
             {"eager": 1e-3, "unfused": 1e-3, "fused": 2e-3}),
        # unfused failed: no time, no ratio over it
        _row("robot 1tok 8e h1024", 1, {"eager": 80.0, "fused": 20.0}, {"fused": {"eager": 4.0}},
             {"eager": 14, "fused": 4}, {"eager": 1e-3, "unfused": math.nan, "fused": 2e-3}),
        # fused wrong: not timed
        _row("robot 32tok 8e h1024", 32, {"eager": 80.0, "unfused": 50.0}, {}, {"eager": 14, "unfused": 12},
             {"fused": 0.5, "eager": 1e-3, "unfused": 1e-3}),
        _row("robot 256tok 8e h1024", 256, {"eager": 90.0, "unfused": 33.0, "fused": 30.0},
             {"fused": {"eager": 3.0, "unfused": 1.1}}, {"eager": 14, "unfused": 12, "fused": 5},
             {"eager": 1e-3, "unfused": 1e-3, "fused": 1e-3}, weight_bytes=75_000_000),
    ]
    times = {"eager": 200.0, "unfused": 180.0, "fused": 100.0, "fused_triton": 90.0, "fused_wgmma": 110.0}
    wgmma = "moe_route (e64) + moe_gather (any) + moe_gate_up_gated (wgmma) + moe_down (wgmma) + moe_combine (any)"
    tilings = "moe_route (e64) + moe_gate_up_gated (large) + moe_down (large) + moe_combine (any)"
    for tokens, fused_us, kernels in [(512, 100.0, {"fused": wgmma}), (1024, 80.0, {"fused": wgmma}),
                                      (384, 90.0, {"fused": tilings, "fused_wgmma": wgmma}),
                                      (256, 120.0, {"fused": tilings, "fused_wgmma": wgmma}),
                                      (128, 90.0, {"fused": tilings, "fused_wgmma": tilings})]:
        rows.append(_row(f"dispatch {tokens}tok 8e h2048", tokens, {**times, "fused": fused_us}, {}, {}, {},
                         kernels, top_k=2, experts=8))
    table, goals = bench.table(rows).split("\n\n")
    lines = table.splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| robot 1tok 8e h1024 | 80.0 | - | 20.0 | 4.00x | - | 14 / - / 4 | - | - | nan |" in lines
    assert "| 14 / 12 / 5 | - | 2.50 | 1.0e-03 |" in lines[5]  # 75 MB of weights in 30 us
    assert goals.splitlines() == [
        "Goals (fused):",
        "3500tok: met (2.70 ms; an H100's goal 2.75 ms)",
        "robot 1tok 8e h1024: NOT MET: unfused not timed",
        "robot 32tok 8e h1024: fused not timed (wrong result or missing): NOT MET",
        "robot 256tok 8e h1024: NOT MET: x unfused 1.10 < 1.2, 5 launches > 4",
        "dispatch 512tok 8e h2048 (128 rows per expert): fused (wgmma) x fused_triton 0.90: NOT the faster path: "
        "the rule (rule_path) belongs elsewhere",
        "dispatch 1024tok 8e h2048 (256 rows per expert): fused (wgmma) x fused_triton 1.12: the faster path",
        "dispatch 384tok 8e h2048 (96 rows per expert): fused (tilings) x fused_wgmma 1.22: the faster path",
        "dispatch 256tok 8e h2048 (64 rows per expert): fused (tilings) x fused_wgmma 0.92: NOT the faster path: "
        "the rule (rule_path) belongs elsewhere",
        "dispatch 128tok 8e h2048 (32 rows per expert): fused took the Triton tilings (the wgmma path does not serve "
        "here)",
    ]
