"""Grouped-GEMM benchmark: torch._grouped_mm vs a 48 KiB Torch-TensorRT-kind kernel vs ours.

Runs on a GPU with no Triton in the process: the kernels are ahead-of-time images
(made on any machine by benchmarks/device/prepare.py) launched through the C++
launcher (runtime/kernels). Each time is the median over 21 rounds of CUDA-graph replays of
back-to-back calls (about 30 ms of them), each timed replay right after an untimed one of
the same graph, the contenders taking turns in a fresh random order each round: the H200
runs these GEMMs at its power limit and its clock follows the load of the last tens of
milliseconds, so a kernel timed right after a lighter one would borrow its clock. All
run side by side in one process on the same inputs, and each result is checked against
torch._grouped_mm before it is timed.

    python benchmarks/grouped_mm_bench.py --images .device/bench_images.json --out results/

With --sustained S, each of torch._grouped_mm, the baseline and ours then also runs alone for
S seconds at the large shapes, with the SM clock and power draw sampled (sustained.py): at the
power cap, speed is energy per product, and this shows it.

Shapes: MoE layers of 128 experts, hidden 3072, expert FFN 3072, top-8 at 3500
and 8740 tokens (gate+up: K 3072, N 6144; down: K 3072, N 3072), and robot sizes
(1 to 256 tokens, 8 to 64 experts, hidden 1024 to 2048, top-2). Weights are stored
[experts, N, K] (trans_b), as MoE layers keep them.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import random
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import GroupedMMLauncher  # noqa: E402

import sustained  # noqa: E402  (benchmarks/, next to this file)

logger = logging.getLogger("grouped_mm_bench")

LARGE = [(t, 128, 3072, 3072, 8) for t in (3500, 8740)]  # tokens, experts, hidden, ffn, top_k
ROBOT = [(t, e, h, h, 2) for t in (1, 32, 256) for e in (8, 64) for h in (1024, 2048)]


def layer_shapes(skip_robot: bool) -> list[tuple]:
    """(name, tokens, experts, hidden, ffn, top_k, replay seconds, rounds): the MoE shapes, then (unless
    skipped) the robot sizes, with the replay length and rounds the FP8 benchmarks time them with."""
    shapes = [(f"{t}tok", t, e, h, f, k, 0.03, 21) for t, e, h, f, k in LARGE]
    if not skip_robot:
        shapes += [(f"robot {t}tok {e}e h{h}", t, e, h, f, k, 0.015, 15) for t, e, h, f, k in ROBOT]
    return shapes


def ratio_summary(rows: list[dict], fast: str, others: tuple[str, ...], unit: str) -> str:
    """Lines "<part>: <fast> x <other>: median, range" over the MoE shapes and over the robot sizes: each
    other's time over fast's (rows' "us"), where both were timed."""
    text = ""
    for part, robot in (("MoE shapes", False), ("robot sizes", True)):
        subset = [r for r in rows if r["shape"].startswith("robot") == robot]
        for other in others:
            values = [r["us"][other] / r["us"][fast] for r in subset if fast in r["us"] and other in r["us"]]
            if values:
                text += (f"\n{part}: {fast} x {other}: median {statistics.median(values):.2f}x, "
                         f"range {min(values):.2f}x-{max(values):.2f}x over {len(values)} {unit}")
    return text


def fp8_parser(description: str) -> argparse.ArgumentParser:
    """The arguments the FP8 benchmarks share: the images prepare.py saved, the output folder, --skip-robot."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--skip-robot", action="store_true", help="the MoE shapes only (tuning runs)")
    return parser


def start_fp8_bench(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, dict[str, GroupedMMLauncher]]:
    """The parsed arguments and the contenders' launchers, with logging on and the device printed."""
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    launchers = load_launchers(args.images)
    print_device()
    return args, launchers


def save_results(out: pathlib.Path, stem: str, rows: list[dict], text: str) -> None:
    """<stem>.json (every row) and <stem>.md (the table) in `out`; the table printed last."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{stem}.md").write_text(text + "\n")
    print("\n" + text)


def routed_offsets(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    choice = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
    return torch.cumsum(torch.bincount(choice, minlength=experts), 0).to(torch.int32)


def capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` back-to-back calls (after a warm-up), so launch overhead stays out."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_rounds(graphs: dict, calls: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each graph in each round. Each replay is timed after an untimed one of
    the same graph, so the clock has settled to that kernel's own power draw; the order
    is shuffled each round (seeded), so drift and neighbours affect all contenders alike."""
    times = {label: [] for label in graphs}
    order = list(graphs)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for label in order:
            graph = graphs[label]
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[label].append(start.elapsed_time(end) / 1e3 / calls)
    return times


def time_interleaved(graphs: dict, calls: int, rounds: int) -> dict:
    """Median seconds per call for each graph, timed as time_rounds does."""
    return {label: statistics.median(t) for label, t in time_rounds(graphs, calls, rounds).items()}


def launch_fn(launcher: GroupedMMLauncher, a, w, offs, out):
    """w is [experts, N, K] for trans_b launchers, else [experts, K, N]."""
    rows, k = a.shape
    n = w.shape[1] if launcher.trans_b else w.shape[2]

    def run():
        launcher.launch(a.data_ptr(), w.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, w.shape[0],
                        launcher.trans_b, torch.cuda.current_stream().cuda_stream)

    return run


def replay_calls(replay_s: float, call_s: float) -> int:
    """Calls per CUDA-graph replay: enough to fill about replay_s at an estimated call_s each, 4 to 1000."""
    return min(1000, max(4, round(replay_s / call_s)))


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6))


def bench_shape(name, tokens, experts, k, n, top_k, launchers, seed, sampler=None, sustained_s=0.0):
    offs = routed_offsets(tokens, experts, top_k, seed).cuda()
    rows = tokens * top_k
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(experts, n, k, device="cuda", dtype=torch.float32) / k**0.5).to(torch.bfloat16)
    flops = 2.0 * rows * k * n
    # ~30 ms per replay: a call's time estimated at 500 TFLOP/s or 4 TB/s (weights, a, out).
    estimate = max(flops / 500e12, 2.0 * (experts * k * n + rows * (k + n)) / 4e12, 5e-6)
    calls, rounds = replay_calls(0.03, estimate), 21
    ref = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    row = {"shape": name, "tokens": tokens, "experts": experts, "rows": rows, "K": k, "N": n}
    graphs = {"torch": capture(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), calls)}
    outs = []
    for label, launcher in launchers.items():
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        # Weights stored [experts, K, N] for the launchers built for that layout.
        fn = launch_fn(launcher, a, w if launcher.trans_b else w.transpose(1, 2).contiguous(), offs, out)
        fn()
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        row[f"{label}_kernel"] = launcher.last_kernel
        row[f"{label}_err"] = err
        if not err < 1e-2:
            logger.error("%s %s: wrong result (relative error %.3e); not timed", name, label, err)
            continue
        graphs[label] = capture(fn, calls)
        outs.append(out)
    row.update({label: float("nan") for label in launchers})
    row.update(time_interleaved(graphs, calls, rounds))
    row["tflops"] = {key: flops / row[key] / 1e12 for key in ["torch", *launchers]}
    if sampler is not None and sustained_s > 0:
        row["sustained"] = {}
        for label in ("torch", "baseline48k", "ours"):
            if label in graphs:
                result = sustained.run(graphs[label], calls, sustained_s, sampler)
                result["tflops"] = flops / result["s_per_call"] / 1e12
                row["sustained"][label] = result
    del a, w, outs, ref, graphs
    torch.cuda.empty_cache()
    return row


def load_launchers(images_path: str) -> dict[str, GroupedMMLauncher]:
    """One launcher per contender, of the images benchmarks/device/prepare.py saved at `images_path` that
    its .groups.json names for it."""
    images = load_images(images_path)
    torch.empty(1, device="cuda")  # the launcher loads into the current CUDA context
    groups: dict[str, list[int]] = json.loads(pathlib.Path(images_path).with_suffix(".groups.json").read_text())
    return {label: GroupedMMLauncher([images[i] for i in indices]) for label, indices in groups.items()}


def print_device() -> None:
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"triton imported: {'triton' in sys.modules}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--skip-robot", action="store_true")
    parser.add_argument("--sustained", type=float, default=0.0, metavar="S",
                        help="also run torch, the baseline and ours alone for S seconds each at the large shapes, "
                             "sampling SM clock and power (needs nvidia-smi)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    launchers = load_launchers(args.images)  # {"baseline48k": ..., "ours": ..., candidates...}
    contenders = {x: launchers[x] for x in ("baseline48k", "ours")}
    # Candidates named large_* are timed at the MoE shapes, small_* at robot sizes, all_* at both.
    large = {**contenders, **{k: v for k, v in launchers.items() if k.startswith(("large_", "all_"))}}
    small = {**contenders, **{k: v for k, v in launchers.items() if k.startswith(("small_", "all_"))}}
    print_device()

    rows = []
    sampler = None
    if args.sustained > 0:
        if sustained.GpuSampler.available():
            sampler = sustained.GpuSampler().start()
        else:
            logger.warning("nvidia-smi not found: no sustained runs (--sustained)")
    for tokens, experts, hidden, ffn, top_k in LARGE:
        for gemm, k, n in (("gate_up", hidden, 2 * ffn), ("down", ffn, hidden)):
            name = f"{tokens}tok {gemm}"
            rows.append(bench_shape(name, tokens, experts, k, n, top_k, large, seed=tokens, sampler=sampler,
                                    sustained_s=args.sustained))
            logger.info("%s: %s", name, {k: round(v, 1) for k, v in rows[-1]["tflops"].items()})
    if sampler is not None:
        sampler.stop()
    if not args.skip_robot:
        for tokens, experts, hidden, ffn, top_k in ROBOT:
            for gemm, k, n in (("gate_up", hidden, 2 * ffn), ("down", ffn, hidden)):
                name = f"robot {tokens}tok {experts}e h{hidden} {gemm}"
                rows.append(bench_shape(name, tokens, experts, k, n, top_k, small, seed=tokens + experts))
                logger.info("%s: %s", name, {k: round(v, 1) for k, v in rows[-1]["tflops"].items()})

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grouped_mm_bench.json").write_text(json.dumps(rows, indent=1))
    candidates = [c for c in launchers if c not in contenders]
    if candidates:
        print("\nCandidate configurations (ratio to torch._grouped_mm):")
        print("  " + " ".join(c.split("_", 1)[1][:22].rjust(22) for c in candidates) + "  shape")
        for row in rows:
            cells = [f"{row['tflops'][c] / row['tflops']['torch']:.2f}".rjust(22) if c in row["tflops"] else " " * 22
                     for c in candidates]
            print("  " + " ".join(cells) + f"  {row['shape']} (torch {row['tflops']['torch']:.1f} TFLOP/s)")
    lines = ["| shape | rows | K | N | torch._grouped_mm TFLOP/s | 48 KiB baseline TFLOP/s (x torch) | ours TFLOP/s (x torch) | ours us | kernel |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        t = row["tflops"]
        lines.append(f"| {row['shape']} | {row['rows']} | {row['K']} | {row['N']} | {t['torch']:.1f} | "
                     f"{t['baseline48k']:.1f} ({t['baseline48k'] / t['torch']:.2f}x) | {t['ours']:.1f} ({t['ours'] / t['torch']:.2f}x) | "
                     f"{row['ours'] * 1e6:.1f} | {row['ours_kernel']} |")
    steady = [row for row in rows if "sustained" in row]
    if steady:
        lines += ["", f"Sustained: each alone for {args.sustained:g} s after {sustained.WARM_UP_S:g} s of warm-up, "
                      "median SM clock and power draw over that time (nvidia-smi, every 50 ms).", "",
                  "| shape | contender | TFLOP/s (x torch) | SM clock MHz | power W | J per TFLOP | samples |",
                  "|---|---|---|---|---|---|---|"]
        for row in steady:
            base = row["sustained"]["torch"]["tflops"]
            for label, r in row["sustained"].items():
                lines.append(f"| {row['shape']} | {label} | {r['tflops']:.1f} ({r['tflops'] / base:.3f}x) | "
                             f"{r['sm_mhz']:.0f} | {r['watts']:.1f} | {r['watts'] / r['tflops']:.3f} | {r['samples']} |")
    table = "\n".join(lines)
    (args.out / "grouped_mm_bench.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
