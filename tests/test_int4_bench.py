"""benchmarks/int4_experts_bench.py on the CPU: ExecuTorch's byte order of our INT4 values (its comparator must get
the same weights), and the report from the rows a device run makes, contenders that were not timed included."""

import pathlib
import re

import pytest
import torch
from support.benchmark_modules import benchmark_module

from et_trt_backend import int4_weights
from et_trt_backend.kernels import int4_mma


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("int4_experts_bench") as module:
        yield module


def test_executorch_byte_order_holds_the_same_values(bench):
    """ExecuTorch's fused_moe reads element k of a row as (byte[k // 2] >> 4 * (k % 2)) & 0xF, minus 8."""
    w = int4_weights.quantize(torch.randn(2, 3, 256), 128)
    packed = bench.et_packed(w)
    assert packed.dtype == torch.int8 and packed.shape == (2, 3, 128)
    k = torch.arange(256)
    values = (packed.to(torch.int16)[..., k // 2] >> (4 * (k % 2))) & 0xF
    assert torch.equal(values - 8, int4_weights.unpack(w.packed, 256).to(torch.int16))


def test_report_names_what_was_not_met_or_not_timed(bench):
    rows = [
        {"tokens": 1, "experts": 8, "hidden": 1024, "ffn": 1024, "launches": {"int4": 3},
         "us": {"int4": 5.0, "int4_sm80": 6.0, "bf16": 13.0, "et_decode": 7.0, "et_batched": 20.0, "et": 7.0},
         "x": {"bf16": 2.6, "et": 1.2}, "touched_bytes": 3.2e6, "vs_bf16": 0.11, "kernels": "moe_gemv_down"},
        {"tokens": 256, "experts": 8, "hidden": 1024, "ffn": 1024, "launches": {}, "us": {"bf16": 40.0}, "x": {},
         "touched_bytes": 1e7},
    ]
    text = bench.table(rows, 3e12)
    assert text.splitlines()[-3:] == [
        "  NOT MET 8x1024x1024 1 tok: int4 x et 1.20 < 1.3",
        "  NOT MET 8x1024x1024 1 tok: sm_80 images at 18% of the copy bandwidth < 60%",
        "  NOT MET 8x1024x1024 256 tok: int4 x bf16 - < 1.5"]
    assert "Goals: 1 met, 3 not met" in text and "| 8x1024x1024 | 256 | - | - | 40.0 |" in text


def test_sweep_report_ranks_the_blockings():
    """benchmarks/int4_gemv_sweep.py's tables: per shape the fastest blocking, the fastest mma.sync ("mma_") and
    per-pair one, the shipped launcher with and without programmatic dependent launch and as built at a baseline
    revision (none of them a blocking) and the ratios against the fastest, then each blocking's mean slowdown; a shape
    where no blocking was timed is left out, not a crash."""
    with benchmark_module("int4_gemv_sweep") as sweep:
        rows = [
            {"tokens": 1, "experts": 8, "hidden": 1024, "ffn": 1024, "touched_bytes": 3e6, "shipped_kernels":
             "moe_gemv_gate_up_gated (gemv) + moe_gemv_down (gemv)",
             "us": {"n8_k256_w2_s3": 10.0, "n4_k512_w2_s3_paired": 5.0, "shipped": 10.0, "shipped_no_pdl": 12.0,
                    "shipped_67ef6f7": 11.0, "bf16": 15.0, "et_decode": 12.0}},
            {"tokens": 64, "experts": 8, "hidden": 1024, "ffn": 1024, "touched_bytes": 3e6,
             "shipped_kernels": "moe_route (e64)",
             "us": {"n8_k256_w2_s3": 20.0, "n4_k512_w2_s3_paired": 40.0, "mma_w4t1p16c4s4": 10.0}},
            {"tokens": 4, "experts": 8, "hidden": 1024, "ffn": 1024, "touched_bytes": 3e6, "us": {"bf16": 9.0}},
        ]
        text = sweep.table(rows, 2e12)
    lines = text.splitlines()
    assert lines[4] == ("| 8x1024x1024 | 1 | n4_k512_w2_s3_paired | 5.0 | 30% | None | - | n4_k512_w2_s3_paired | 5.0 | "
                        "10.0 (gemv) | 12.0 | 1.200 | 11.0 | 1.100 | 15.0 | 12.0 | 3.00x | 2.40x | 2.00x |")
    assert lines[5].startswith("| 8x1024x1024 | 64 | mma_w4t1p16c4s4 | 10.0 | 15% | mma_w4t1p16c4s4 | "
                               "10.0 | n8_k256_w2_s3 | 20.0 | - (tiles) | - | - | - | - |")
    assert "| 4 |" not in text
    # Geometric means of time / best at 4-64 tokens (ranked by it) and on all shapes: n4_k512 40 / 10 at 64 tokens,
    # sqrt(1 * 4) on all; n8_k256 20 / 10, sqrt(2 * 2).
    ranking = text.split("| blocking |")[1].splitlines()
    assert ranking[2:] == ["| mma_w4t1p16c4s4 | 1.000 | 1 | 1.000 | 1 |",
                           "| n8_k256_w2_s3 | 2.000 | 1 | 2.000 | 2 |",
                           "| n4_k512_w2_s3_paired | 4.000 | 1 | 2.000 | 2 |"]


def test_sweep_device_call_names_prepared_builds():
    """benchmarks/device/int4_sweep_run.sh's compute-sanitizer step names builds of prepare.py's MMA_SWEEP (a label
    that names none checks nothing)."""
    with benchmark_module("device.prepare") as prepare:
        labels = {int4_mma.sweep_label(*build) for build in prepare.MMA_SWEEP}
    script = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "int4_sweep_run.sh").read_text()
    named = re.search(r"--labels ([^\n]+)", script)[1].split()
    assert named and set(named) <= labels, (named, sorted(labels))


def test_sweep_shapes_are_parsed_and_refused_by_name():
    """int4_gemv_sweep.py --shapes: experts x hidden x ffn, comma-separated; anything else named."""
    import argparse

    with benchmark_module("int4_gemv_sweep") as sweep:
        assert sweep.parse_shapes("16x1024x1024, 32x2048x4096") == [(16, 1024, 1024), (32, 2048, 4096)]
        for bad in ("16x1024", "16x1024x0", "axbxc"):
            with pytest.raises(argparse.ArgumentTypeError, match=f"shape '{bad}' is not experts x hidden x ffn"):
                sweep.parse_shapes(bad)
