"""A whole MoE block's experts, from top-k ids to the combined output (issue 32 item 4): the fused kernels against
PyTorch eager and against our unfused GroupedMM kernels plus the glue.

  eager    argsort / histc / cumsum / gather -> torch._grouped_mm -> SwiGLU -> torch._grouped_mm -> weighted
           index_add (what a bf16 PyTorch MoE block runs)
  unfused  the same glue in PyTorch around our GroupedMM kernel (two launches of the C++ launcher): what the
           GroupedMM lowering runs, less TensorRT's own glue kernels
  fused    our MoEExperts kernels through the C++ launcher (moe_experts_launcher.h), gate+up rows in the
           "blocked8" layout the lowering writes; fused_<label> contenders are other image sets
           (benchmarks/device/prepare.py's moe_bench_images.groups.json), fused_wgmma the fused images with the
           wgmma path forced wherever it serves (MoEExpertsLauncher.set_gemm_path), fused_no_pdl the fused images
           launched without programmatic dependent launch (MoEExpertsLauncher.set_programmatic_launch)

Runs on a GPU with no Triton in the process: every kernel of ours is an AOT image. Method as
grouped_mm_bench.py: CUDA graphs of back-to-back calls (~30 ms at the MoE shapes, ~15 ms at robot sizes), every
timed replay right after an untimed one of the same graph, the contenders in a fresh random order each round; the
ratios are medians of the rounds' paired ratios (each round's eager time over its fused time), so the card's drift
cancels. Each contender's output is checked against moe_experts.reference (float32, on the GPU) before it is timed.
Kernel launches per block are counted with torch.profiler (CUPTI): device kernels of one call, memsets included.

    python benchmarks/moe_block_bench.py --images .device/moe_bench_images.json --out results/
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import pathlib
import statistics
import sys

import torch
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)

from et_trt_backend import moe_experts  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import (  # noqa: E402
    GroupedMMLauncher,
    MoEExpertsLauncher,
    moe_workspace_bytes,
)
from et_trt_backend.kernels.moe_op import launch_args  # noqa: E402

logger = logging.getLogger("moe_block_bench")

# tokens, experts, hidden, FFN, top-k: the MoE layer of the goals, and robot sizes.
MOE = [(t, 128, 3072, 3072, 8) for t in (3500, 8740)]
ROBOT = [(t, e, h, h, 2) for t in (1, 32, 256) for e in (8, 64) for h in (1024, 2048)]
# Where the launcher's rule (MoEExpertsLauncher::rule_path: wgmma from H, F >= 2560 with 32 rows per expert, or
# H, F >= 2048 with 128) is checked against the other path: 64 rows per expert at 8 experts x H 2048 (Triton's
# side of the second threshold), 512 at 64 experts x H 2048 (wgmma's side, 1.45x in the last sweep), 64 at H 2560
# (the first size threshold) and 32 rows per expert at the MoE layer's H 3072 (the fewest rows measured faster).
DISPATCH = [(256, 8, 2048, 2048, 2), (16384, 64, 2048, 2048, 2), (2048, 64, 2560, 2560, 2), (512, 128, 3072, 3072, 8)]
# Issue 32's "done when": fused over eager at the MoE shapes; over eager and over unfused at robot sizes.
GOALS = {"moe": {"eager": 1.2}, "robot": {"eager": 1.5, "unfused": 1.2}}
MAX_ROBOT_LAUNCHES = 4
H100_MS = {3500: 2.75, 8740: 5.5}  # the goals' absolute times on an H100


def routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids (int32) and their softmax weights (float32) of random router logits."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    values, ids = logits.topk(top_k, dim=1)
    return ids.to(torch.int32), values.softmax(-1)


def glue_block(grouped_mm):
    """The eager block, with `grouped_mm(rows, w [E, N, K], offs)` doing both GEMMs."""

    def block(hidden, ids, weights, w_gate_up, w_down):
        experts, ffn = w_down.shape[0], w_down.shape[2]
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.histc(flat.float(), bins=experts, min=0, max=experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = order // ids.shape[1]
        gate_up = grouped_mm(hidden[token], w_gate_up, offs)
        h = F.silu(gate_up[:, :ffn]) * gate_up[:, ffn:]
        y = grouped_mm(h, w_down, offs) * weights.flatten()[order].unsqueeze(-1).to(hidden.dtype)
        return torch.zeros_like(hidden).index_add_(0, token, y)

    return block


def torch_grouped_mm(rows, w, offs):
    return torch._grouped_mm(rows, w.transpose(-2, -1), offs=offs)


def ours_grouped_mm(launcher: GroupedMMLauncher):
    def run(rows, w, offs):
        out = torch.empty(rows.shape[0], w.shape[1], dtype=rows.dtype, device=rows.device)
        launcher.launch(rows.data_ptr(), w.data_ptr(), offs.data_ptr(), out.data_ptr(), rows.shape[0], rows.shape[1],
                        w.shape[1], w.shape[0], True, torch.cuda.current_stream().cuda_stream)
        return out

    return run


def launch_block(launcher: MoEExpertsLauncher, buffers: dict, hidden, ids, weights, w_gate_up, w_down, ffn: int,
                 layout: str, experts: int = 0, **quantized) -> torch.Tensor:
    """One launch of our MoEExperts kernels (SwiGLU) on device tensors; the output and workspace are allocated once
    per shape in `buffers`, outside the graphs. `quantized`: moe_op.launch_args' scale tensors and group size.
    `experts`: the count the launcher is told, if more than the weights hold (ids stay below the real count; the
    launcher's rules that depend on it see the larger one)."""
    (tokens, size), top_k = hidden.shape, ids.shape[1]
    experts = max(experts, w_down.shape[0])
    key = (tokens, top_k, experts, size, ffn)
    if key not in buffers:
        buffers.clear()
        buffers[key] = (torch.empty(tokens, size, dtype=hidden.dtype, device="cuda"),
                        torch.empty(moe_workspace_bytes(*key), dtype=torch.uint8, device="cuda"))
    out, workspace = buffers[key]
    launcher.launch(launch_args(hidden, ids, weights, w_gate_up, w_down, out, workspace, experts=experts, ffn=ffn,
                                gate_up_layout=layout, **quantized), torch.cuda.current_stream().cuda_stream)
    return out


def fused_block(launcher: MoEExpertsLauncher, layout: str):
    """Our MoEExperts kernels (launch_block)."""
    buffers = {}

    def block(hidden, ids, weights, w_gate_up, w_down):
        return launch_block(launcher, buffers, hidden, ids, weights, w_gate_up, w_down, w_down.shape[2], layout)

    block.launcher = launcher
    return block


def launches(fn) -> int:
    """Device kernels (and memsets) one call enqueues, from CUPTI through torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_time_total > 0)


def block_inputs(tokens, experts, size, ffn, top_k) -> tuple:
    """Random bf16 operands of one block (SwiGLU weights in the "concat" layout and in "blocked8"), the routing and
    the float32 reference's output: hidden, ids, weights, w_gate_up, blocked, w_down, ref."""
    gen = torch.Generator(device="cuda").manual_seed(tokens + experts + size)
    hidden = torch.randn(tokens, size, device="cuda", generator=gen).to(torch.bfloat16)
    w_gate_up = (torch.randn(experts, 2 * ffn, size, device="cuda", generator=gen) / size**0.5).to(torch.bfloat16)
    w_down = (torch.randn(experts, size, ffn, device="cuda", generator=gen) / ffn**0.5).to(torch.bfloat16)
    ids, weights = routing(tokens, experts, top_k, tokens + experts)
    blocked, _ = moe_experts.relayout(w_gate_up, None, "concat", "blocked8")
    ref = moe_experts.reference(hidden, ids, weights, w_gate_up, w_down)
    return hidden, ids, weights, w_gate_up, blocked, w_down, ref


def checked_calls(name: str, contenders: dict, inputs: tuple, row: dict) -> dict:
    """label -> a call of each contender on `inputs` (block_inputs') whose output matches the reference; each
    contender's relative error goes to row["err"] (NaN where it failed)."""
    hidden, ids, weights, w_gate_up, blocked, w_down, ref = inputs
    fns = {}
    for label, (block, fused) in contenders.items():
        fn = (lambda block=block: block(hidden, ids, weights, blocked, w_down)) if fused else (
            lambda block=block: block(hidden, ids, weights, w_gate_up, w_down))
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as e:  # reported and not timed; the other contenders still are
            logger.error("%s %s: failed: %s", name, label, e)
            row["err"][label] = float("nan")
            continue
        row["err"][label] = bench.rel_err(out, ref)
        if not row["err"][label] < 2e-2:
            logger.error("%s %s: wrong result (relative error %.3e); not timed", name, label, row["err"][label])
            continue
        fns[label] = fn
    return fns


def timed_calls(fns: dict, tokens, experts, size, ffn, top_k, replay_s, rounds) -> dict[str, list[float]]:
    """Seconds per call of each of `fns` in each round: CUDA graphs of about replay_s, paired rounds."""
    flops = 6.0 * tokens * top_k * size * ffn
    estimate = max(flops / 500e12, 2.0 * 3 * experts * size * ffn / 3e12, 20e-6)
    calls = bench.replay_calls(replay_s, estimate)
    graphs = {label: bench.capture(fn, calls) for label, fn in fns.items()}
    return bench.time_rounds(graphs, calls, rounds)


def paired_ratio(times: dict[str, list[float]], other: str, label: str) -> float:
    """How many times faster `label` ran than `other`: the median of the rounds' ratios."""
    return statistics.median(o / f for o, f in zip(times[other], times[label]))


def bench_block(name, tokens, experts, size, ffn, top_k, replay_s, rounds, contenders) -> dict:
    inputs = block_inputs(tokens, experts, size, ffn, top_k)
    ids = inputs[1]
    touched = torch.unique(ids[(ids >= 0) & (ids < experts)]).numel()
    row = {"shape": name, "tokens": tokens, "experts": experts, "hidden": size, "ffn": ffn, "top_k": top_k,
           "err": {}, "launches": {}, "kernels": {},
           # the weights of the experts the ids touch (gate+up 2F x H, down H x F): the floor's bytes at robot sizes
           "weight_bytes": touched * 3 * size * ffn * inputs[0].element_size()}
    fns = checked_calls(name, contenders, inputs, row)
    for label, fn in fns.items():
        row["launches"][label] = launches(fn)
        if contenders[label][1]:
            row["kernels"][label] = contenders[label][0].launcher.last_kernels
    times = timed_calls(fns, tokens, experts, size, ffn, top_k, replay_s, rounds)
    row["us"] = {label: statistics.median(t) * 1e6 for label, t in times.items()}
    row["x"] = {}  # fused contenders over each other contender: the median of the rounds' ratios
    for label in times:
        if label.startswith("fused"):
            row["x"][label] = {other: paired_ratio(times, other, label) for other in times
                               if not other.startswith("fused")}
    del fns, inputs
    torch.cuda.empty_cache()
    return row


def load_contenders(images_path: str) -> dict:
    """label -> (block function, takes blocked8 weights): eager, and our launchers of the image groups
    benchmarks/device/prepare.py saved ("unfused": GroupedMM images, "fused*": MoE experts images)."""
    images = load_images(images_path)
    torch.empty(1, device="cuda")  # the launchers load into the current CUDA context
    groups: dict[str, list[int]] = json.loads(pathlib.Path(images_path).with_suffix(".groups.json").read_text())
    contenders = {"eager": (glue_block(torch_grouped_mm), False)}
    for label, indices in groups.items():
        chosen = [images[i] for i in indices]
        if not label.startswith("fused"):
            contenders[label] = (glue_block(ours_grouped_mm(GroupedMMLauncher(chosen))), False)
            continue
        contenders[label] = (fused_block(MoEExpertsLauncher(chosen), "blocked8"), True)
        if label == "fused":  # the dispatch check's other side where the rule takes the Triton tilings
            forced = MoEExpertsLauncher(chosen)
            forced.set_gemm_path("wgmma")
            contenders["fused_wgmma"] = (fused_block(forced, "blocked8"), True)
            serialized = MoEExpertsLauncher(chosen)  # what programmatic dependent launch saves
            serialized.set_programmatic_launch(False)
            contenders["fused_no_pdl"] = (fused_block(serialized, "blocked8"), True)
    return contenders


def table(rows: list[dict]) -> str:
    fused = sorted({label for r in rows for label in r["x"]})
    lines = ["| shape | eager us | unfused us | " + " | ".join(f"{f} us" for f in fused) + " | " +
             " | ".join(f"{f} x eager | {f} x unfused" for f in fused) + " | launches eager / unfused / " +
             " / ".join(fused) + " | fused kernels | fused weights TB/s | max err |",
             "|---" * (6 + 3 * len(fused)) + "|---|"]
    for r in rows:
        us = r["us"]
        cells = [f"{us[label]:.1f}" if label in us else "-" for label in ["eager", "unfused", *fused]]
        ratios = [" | ".join(f"{r['x'][f][other]:.2f}x" if other in r["x"].get(f, {}) else "-"
                             for other in ("eager", "unfused")) for f in fused]
        counts = " / ".join(str(r["launches"].get(label, "-")) for label in ["eager", "unfused", *fused])
        rate = f"{r['weight_bytes'] / us['fused'] / 1e6:.2f}" if "weight_bytes" in r and "fused" in us else "-"
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {counts} | "
                     f"{r['kernels'].get('fused', '-')} | {rate} | {worst(r['err'].values()):.1e} |")
    return "\n".join(lines) + "\n\n" + goals(rows)


def worst(errors) -> float:
    """The largest error, NaN (a contender that failed) above all."""
    return max(errors, key=lambda e: math.inf if math.isnan(e) else e, default=math.nan)


def goals(rows: list[dict]) -> str:
    """Issue 32's goals for the "fused" contender, shape by shape: met or not."""
    lines = []
    for r in rows:
        if r["shape"].startswith("dispatch"):
            lines.append(dispatch(r))
            continue
        part = "robot" if r["shape"].startswith("robot") else "moe"
        x = r["x"].get("fused")
        if x is None:
            lines.append(f"{r['shape']}: fused not timed (wrong result or missing): NOT MET")
            continue
        misses = [f"{other} not timed" if other not in x else f"x {other} {x[other]:.2f} < {bound}"
                  for other, bound in GOALS[part].items() if not x.get(other, 0.0) >= bound]
        if part == "robot" and r["launches"].get("fused", 0) > MAX_ROBOT_LAUNCHES:
            misses.append(f"{r['launches']['fused']} launches > {MAX_ROBOT_LAUNCHES}")
        if part == "moe":
            ms = r["us"]["fused"] / 1e3
            note = f" ({ms:.2f} ms; an H100's goal {H100_MS[r['tokens']]} ms)"
        else:
            note = ""
        lines.append(f"{r['shape']}: {'NOT MET: ' + ', '.join(misses) if misses else 'met'}{note}")
    return "Goals (fused):\n" + "\n".join(lines)


def dispatch(r: dict) -> str:
    """Whether the launcher's rule ("fused") took the faster of the wgmma path ("fused_wgmma", forced) and the Triton
    tilings ("fused_triton"): within 3%, the runs' noise."""
    name = f"{r['shape']} ({r['tokens'] * r['top_k'] // r['experts']} rows per expert)"
    us, kernels = r["us"], r["kernels"]
    took, other = ("wgmma", "fused_triton") if "wgmma" in kernels.get("fused", "") else ("tilings", "fused_wgmma")
    if "fused" not in us or other not in us:
        return f"{name}: fused or {other} not timed"
    if other == "fused_wgmma" and "wgmma" not in kernels.get(other, ""):
        return f"{name}: fused took the Triton tilings (the wgmma path does not serve here)"
    x = us[other] / us["fused"]
    verdict = "the faster path" if x >= 0.97 else "NOT the faster path: the rule (rule_path) belongs elsewhere"
    return f"{name}: fused ({took}) x {other} {x:.2f}: {verdict}"


def bench_shapes(shapes, bench_block, contenders: dict, json_path: pathlib.Path, ratios: str, rounded) -> list[dict]:
    """bench_block at each (name, *shape), the rows written to json_path after each (kept if a later shape fails);
    one shape's failure (out of memory, a capture error) leaves the others' figures. `rounded` rounds one entry of
    a row's "x" for the log line."""
    rows = []
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for name, *shape in shapes:
        try:
            rows.append(bench_block(name, *shape, contenders=contenders))
        except Exception:
            logger.exception("%s: failed", name)
            torch.cuda.empty_cache()
            continue
        logger.info("%s: %s us; %s: %s", name, {label: round(us, 1) for label, us in rows[-1]["us"].items()},
                    ratios, {label: rounded(x) for label, x in rows[-1]["x"].items()})
        json_path.write_text(json.dumps(rows, indent=1))
    return rows



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--skip-robot", action="store_true")
    parser.add_argument("--skip-moe", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    contenders = load_contenders(args.images)
    bench.print_device()
    shapes = [] if args.skip_moe else [(f"{t}tok", t, e, h, f, k, 0.03, 21) for t, e, h, f, k in MOE]
    if not args.skip_robot:
        shapes += [(f"robot {t}tok {e}e h{h}", t, e, h, f, k, 0.015, 15) for t, e, h, f, k in ROBOT]
        shapes += [(f"dispatch {t}tok {e}e h{h}", t, e, h, f, k, 0.015, 15) for t, e, h, f, k in DISPATCH]
    rows = bench_shapes(shapes, bench_block, contenders, args.out / "moe_block_bench.json", "fused over the others",
                        lambda xs: {other: round(x, 3) for other, x in xs.items()})
    bench.save_results(args.out, "moe_block_bench", rows, table(rows))



if __name__ == "__main__":
    main()
