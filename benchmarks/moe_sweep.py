"""Sweep of the fused MoE block's GEMM builds (issue 32): which wgmma build and which Triton tiling is fastest at the
MoE shapes, kernel by kernel, and where the wgmma path beats the Triton tilings (the launcher's dispatch rule).

Contenders (benchmarks/device/prepare.py --sweep: .device/moe_sweep_images.json and its groups), all through the
C++ launcher with no Triton in the process:
  eager                 PyTorch's block (moe_block_bench.glue_block around torch._grouped_mm)
  fused_tilings         the shipped Triton tilings (the launcher picks one by rows per expert)
  fused_wgmma_s<S>_c<C> the shipped tilings plus the wgmma GEMMs built with S stages and clusters of C CTAs
                        (wgmma_s4_c2 ships), taken wherever they serve (MoEExpertsLauncher.set_gemm_path)
  fused_tile_<variant>  one Triton tiling of prepare.py's TILING_SWEEP at every shape (plus "any")
Every Triton contender runs the Triton tilings only.
Shapes: the MoE layer (128 experts, H = F = 3072, top-8: 3500 and 8740 tokens), 128 experts at 32-128 rows per
expert, and the same routing at H = F = 2048; then the dispatch grid: 64 experts x H = F = 2048 at 16384 and 32768
tokens, and 8, 16, 64 experts x 16-512 rows per expert x H = F = 1024, 2048, top-2.
Method: moe_block_bench's (CUDA graphs, paired rounds in shuffled order, medians, every output checked against
the float32 reference before it is timed); each kernel's time is the median over PROFILED_CALLS profiled calls
(torch.profiler, CUPTI). What prints last: the dispatch matrices (block time of the Triton tilings over the wgmma
path's: shipped builds, best of each family), every shape by total routed rows, then per MoE shape every
contender's block and kernel times.
Results: <out>/moe_sweep.json (every figure), <out>/moe_sweep.md (the tables). --deadline-s stops before a shape
that would not finish in time (the tables then hold the shapes done).

    python benchmarks/moe_sweep.py --images .device/moe_sweep_images.json --out results/
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import pathlib
import statistics
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)
import moe_block_bench as block_bench  # noqa: E402

logger = logging.getLogger("moe_sweep")

# tokens, experts, hidden, FFN, top-k
# The MoE layer's sizes, then H = F = 2048 at its expert count and routing (where the wgmma path's edge lies).
MOE = (block_bench.MOE + [(r * 16, 128, 3072, 3072, 8) for r in (32, 64, 128)]
       + [(t, 128, 2048, 2048, 8) for t in (3500, 8740)])
ROWS_PER_EXPERT = (16, 32, 64, 128, 256, 512)
# Around today's threshold (128) first: if the deadline stops the sweep, the shapes left out are the far ones.
# Many rows at 64 experts x H 2048 (16384 and 32768 tokens) first: the forced wgmma path won there after its down
# GEMM's epilogue changed (benchmarks/results/h100_moe_epi/).
DISPATCH = ([(t, 64, 2048, 2048, 2) for t in (16384, 32768)]
            + [(r * e // 2, e, h, h, 2) for r in (128, 256, 64, 512, 32, 16) for e in (8, 16, 64) for h in (1024, 2048)
               if (r * e // 2, e, h) != (16384, 64, 2048)])
PROFILED_CALLS = 5
# A fused block's kernels, as the launcher names them ("moe_gate_up_gated (wgmma)": "gate_up").
STAGES = ("route", "gather", "gate_up", "down", "combine")
SHIPPED = {"triton": "fused_tilings", "wgmma": "fused_wgmma_s4_c2"}
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel


def stage(kernel: str) -> str:
    return next((s for s in STAGES if kernel.startswith("moe_" + s)), kernel)


def kernel_times(fns: dict, contenders: dict) -> dict[str, dict[str, float]]:
    """label -> device microseconds per call of each of its kernels, the median over PROFILED_CALLS calls, from one
    profiled session per shape (a session's start costs ~0.1 s): our launchers' kernels by stage (their
    last_kernels name them in launch order), eager's by kernel name (same-named ones summed). A marker kernel
    (torch.cuda._sleep's) before each contender's calls splits the session's records; a contender whose records do
    not match its launches gets none."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ours = {label: [stage(k) for k in contenders[label][0].launcher.last_kernels.split(" + ")]
            for label in fns if contenders[label][1]}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fn in fns.values():
            torch.cuda._sleep(1)
            for _ in range(PROFILED_CALLS):
                fn()
        torch.cuda.synchronize()
    segments = []  # the records after each marker; those before the first (CUPTI's own, if any) are dropped
    for event in sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                        key=lambda e: e.time_range.start):
        if MARKER in event.name:
            segments.append([])
        elif segments:
            segments[-1].append(event)
    times = {}
    for label, chunk in zip(fns, segments):
        per_call = len(ours[label]) if label in ours else len(chunk) // PROFILED_CALLS
        if not per_call or len(chunk) != per_call * PROFILED_CALLS or (
                label in ours and not all("route" in e.name for e in chunk[::per_call])):  # FP8: moe_fp8_route
            logger.warning("%s: %d kernel records do not match its launches; kernel times left out", label,
                           len(chunk))
            continue
        names = ours.get(label) or [e.name for e in chunk[:per_call]]
        calls = [collections.Counter() for _ in range(PROFILED_CALLS)]
        for i, event in enumerate(chunk):
            calls[i // per_call][names[i % per_call]] += event.time_range.elapsed_us()
        times[label] = {name: statistics.median(c[name] for c in calls) for name in dict.fromkeys(names)}
    return times


def gemm_us(kernels: dict[str, float]) -> float:
    """Eager's grouped GEMMs: its kernels named as GEMMs."""
    return sum(us for name, us in kernels.items() if "gemm" in name.lower() or "cutlass" in name.lower())


def sweep_shape(name: str, shape: tuple, contenders: dict, replay_s: float, rounds: int) -> dict:
    tokens, experts, size, ffn, top_k = shape
    row = {"shape": name, "tokens": tokens, "experts": experts, "hidden": size, "ffn": ffn, "top_k": top_k,
           "rows_per_expert": tokens * top_k / experts, "err": {}}
    inputs = block_bench.block_inputs(*shape)
    fns = block_bench.checked_calls(name, contenders, inputs, row)
    row["kernel_us"] = kernel_times(fns, contenders)
    row["kernels"] = {label: contenders[label][0].launcher.last_kernels for label in fns if contenders[label][1]}
    times = block_bench.timed_calls(fns, *shape, replay_s, rounds)
    row["us"] = {label: statistics.median(t) * 1e6 for label, t in times.items()}
    row["x_eager"] = {label: block_bench.paired_ratio(times, "eager", label) for label in times if "eager" in times}
    del fns, inputs
    torch.cuda.empty_cache()
    return row


def load_contenders(images_path: str) -> dict:
    """moe_block_bench's contenders, each fused one set to its path: wgmma for "fused_wgmma_*", else the tilings."""
    contenders = block_bench.load_contenders(images_path)
    for label, (block, fused) in contenders.items():
        if fused:
            block.launcher.set_gemm_path("wgmma" if label.startswith("fused_wgmma") else "tilings")
    return contenders


def short(label: str) -> str:
    return label.removeprefix("fused_")


def best(row: dict, wgmma: bool) -> str | None:
    """The fastest fused contender of one family (wgmma or Triton) at the row's shape."""
    family = [label for label in row["us"] if label.startswith("fused") and label.startswith("fused_wgmma") == wgmma]
    return min(family, key=row["us"].get, default=None)


def moe_table(row: dict) -> str:
    down_tflop = 2.0 * row["tokens"] * row["top_k"] * row["hidden"] * row["ffn"] / 1e12
    gate_up_tflop = 2 * down_tflop  # 2F columns
    lines = [f"### {row['shape']} ({row['rows_per_expert']:.0f} rows per expert; {gate_up_tflop + down_tflop:.2f} "
             "TFLOP)",
             "| contender | block us | x eager | gate_up us (TFLOP/s) | down us (TFLOP/s) | route+gather+combine us |"
             " err |", "|---|---|---|---|---|---|---|"]
    for label in sorted(row["us"], key=row["us"].get):
        k = row["kernel_us"].get(label, {})
        if label == "eager":
            g = gemm_us(k)
            gemms, rest = (f"{g:.0f} (both GEMMs)", "-") if g else ("-", "-")
            cells = [gemms, "-", rest]
        else:
            cells = [f"{k[s]:.0f} ({t / k[s] * 1e6:.0f})" if k.get(s) else "-"
                     for s, t in (("gate_up", gate_up_tflop), ("down", down_tflop))]
            cells.append(f"{sum(k.get(s, 0.0) for s in ('route', 'gather', 'combine')):.0f}" if k else "-")
        x = row["x_eager"].get(label)
        lines.append(f"| {short(label)} | {row['us'][label]:.0f} | {f'{x:.2f}x' if x else '-'} | " + " | ".join(cells)
                     + f" | {row['err'].get(label, float('nan')):.1e} |")
    return "\n".join(lines)


def ratio(row: dict, triton: str | None, wgmma: str | None) -> str:
    us = row["us"]
    return f"{us[triton] / us[wgmma]:.2f}" if triton in us and wgmma in us else "-"


def dispatch_tables(rows: list[dict]) -> str:
    """Block time of the Triton tilings over the wgmma path's (> 1: wgmma faster): shipped builds, then the best
    contender of each family; and every shape by total routed rows."""
    grid = {(r["experts"], r["hidden"], round(r["rows_per_expert"])): r for r in rows if r["top_k"] == 2}
    keys = sorted({(e, h) for e, h, _ in grid})
    head = "| experts | H=F | " + " | ".join(f"{r} rows" for r in ROWS_PER_EXPERT) + " |"
    rule = "|---|---|" + "---|" * len(ROWS_PER_EXPERT)
    parts = []
    for title, pick in (("shipped: tilings / wgmma_s4_c2", lambda r: (SHIPPED["triton"], SHIPPED["wgmma"])),
                        ("best Triton contender / best wgmma contender", lambda r: (best(r, False), best(r, True)))):
        lines = [f"Dispatch, {title} (> 1: the wgmma path is faster)", head, rule]
        for e, h in keys:
            cells = [ratio(grid[e, h, r], *pick(grid[e, h, r])) if (e, h, r) in grid else "-" for r in ROWS_PER_EXPERT]
            lines.append(f"| {e} | {h} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    lines = ["By total routed rows: pairs | shape | rows per expert | eager us | best Triton (us) | best wgmma (us) | "
             "Triton / wgmma: shipped, best"]
    for r in sorted(rows, key=lambda r: r["tokens"] * r["top_k"]):
        t, w = best(r, False), best(r, True)
        cells = [f"{short(x)} ({r['us'][x]:.0f})" if x else "-" for x in (t, w)]
        eager = f"{r['us']['eager']:.0f}" if "eager" in r["us"] else "-"
        lines.append(f"{r['tokens'] * r['top_k']:>6} | {r['shape']} | {r['rows_per_expert']:.0f} | {eager} | "
                     f"{cells[0]} | {cells[1]} | {ratio(r, SHIPPED['triton'], SHIPPED['wgmma'])}, {ratio(r, t, w)}")
    parts.append("\n".join(lines))
    return "\n\n".join(parts)


def report(rows: list[dict]) -> str:
    """The dispatch tables, then the MoE shapes' (the issue's goals last)."""
    moe = sorted((r for r in rows if r["shape"].startswith("moe")), key=lambda r: r["tokens"])
    return "\n\n".join([dispatch_tables(rows), *(moe_table(r) for r in moe)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py --sweep")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=330.0,
                        help="start no shape that would end later than this many seconds after the start")
    parser.add_argument("--skip-dispatch", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.monotonic()
    contenders = load_contenders(args.images)
    bench.print_device()
    shapes = [(f"moe {t}tok {e}e h{h} top{k}", (t, e, h, f, k), 0.03, 15) for t, e, h, f, k in MOE]
    if not args.skip_dispatch:
        shapes += [(f"dispatch {t}tok {e}e h{h}", (t, e, h, f, k), 0.008, 7) for t, e, h, f, k in DISPATCH]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, longest = [], 0.0
    for name, shape, replay_s, rounds in shapes:
        began = time.monotonic()
        if began - start + longest > args.deadline_s:
            logger.warning("%s and later shapes: skipped (--deadline-s %.0f)", name, args.deadline_s)
            break
        try:
            rows.append(sweep_shape(name, shape, contenders, replay_s, rounds))
        except Exception:  # one shape's failure (out of memory, a capture error) leaves the others' figures
            logger.exception("%s: failed", name)
            torch.cuda.empty_cache()
            continue
        longest = max(longest, time.monotonic() - began) if name.startswith("dispatch") else longest
        logger.info("%s (%.1f s): %s us", name, time.monotonic() - began,
                    {short(label): round(us, 1) for label, us in rows[-1]["us"].items()})
        (args.out / "moe_sweep.json").write_text(json.dumps(rows, indent=1))  # kept if a later shape fails
    bench.save_results(args.out, "moe_sweep", rows, report(rows))


if __name__ == "__main__":
    main()
