"""The INT4 kernels without a route on a GPU (issue 33): which blocking of the vector-matrix kernels
(int4_kernels.py) and of the mma.sync kernels (int4_mma.py) streams the touched experts fastest at 1-256 tokens,
and where each beats the other and the tensor-core tiles.

  <blocking>  the MoE block (gate+up, down, combine) through the C++ launcher with one blocking of the gemv
              kernels (prepare.py's GEMV_SWEEP, label n<rows>_k<K per step>_w<warps>_s<stages>[_paired]) or of the
              mma.sync ones (MMA_SWEEP, label mma_<gate+up>_<down>, int4_mma.MmaConfig.label), sm_90a cubins,
              bf16, forced onto that path at every token count (MoEExpertsLauncher.set_int4_path)
  shipped     the launcher as shipped (int4_images.json): the gemv, mma.sync or tiles path by its rule
  shipped_no_pdl  the same without programmatic dependent launch (MoEExpertsLauncher.set_programmatic_launch):
              what starting each kernel during the one before saves
  shipped_<revision>  the launcher by its rule with the INT4 images as built at that git revision (prepare.py's
              INT4_BASELINE_REV): a kernel change against its previous form, in the same rounds
  bf16        our bf16 MoEExperts kernels
  et_decode   ExecuTorch's fused_moe (its vector-matrix kernel, autotuned; at 1-16 tokens only, where it was the
              faster of its two in h100_int4/)

Method as int4_experts_bench.py (CUDA graphs, paired rounds, every output checked against the float32 INT4
reference before it is timed). Shapes run in order until --deadline-s has passed; the tables print last.

    python benchmarks/int4_gemv_sweep.py --images .device/int4_images.json \
        --sweep .device/int4_sweep_images.json --executorch .device/executorch --out results/ --deadline-s 300
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)
import int4_experts_bench as int4_bench  # noqa: E402
import moe_block_bench  # noqa: E402

from et_trt_backend import int4_weights  # noqa: E402
from et_trt_backend.kernels import int4_mma, moe_aot  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import MoEExpertsLauncher  # noqa: E402

logger = logging.getLogger("int4_gemv_sweep")

TOKENS = [4, 8, 16, 32, 64, 256]  # the mma.sync kernels' range (at 1 token the gemv ones win by 2x, sweep 3)
ET_MAX_TOKENS = 16
ROUNDS = 7


def sweep_contenders(images_path: str, sweep_path: str, mma_ok: pathlib.Path | None = None) -> dict:
    """label -> block function: shipped, bf16, and one per swept blocking (forced onto its path); mma_ok: the
    mma.sync builds that passed int4_mma_check.py (the others are left out: a fault would end the process)."""
    shipped = int4_bench.load_contenders(images_path)
    contenders = {"shipped": shipped["int4"], "bf16": shipped["bf16"]}
    shipped_images = [i for i in load_images(images_path) if i.format == "cubin" and i.dtype == "bf16"
                      and i.kernel.startswith("moe_")
                      and (i.weight_format == "int4" or i.kernel in ("moe_route", "moe_combine"))]
    passed = set(mma_ok.read_text().split()) if mma_ok and mma_ok.exists() else set()
    if mma_ok and any(int4_mma.sweep_label(*build) not in passed for build in moe_aot.MOE_MMA_CONFIGS):
        logger.warning("a shipped mma.sync build did not pass int4_mma_check.py: shipped runs without them")
        shipped_images = [i for i in shipped_images if not i.kernel.startswith("moe_mma_")]
        contenders["shipped"] = int4_bench.int4_block(MoEExpertsLauncher(shipped_images))
    no_pdl = MoEExpertsLauncher(shipped_images)
    no_pdl.set_programmatic_launch(False)
    contenders["shipped_no_pdl"] = int4_bench.int4_block(no_pdl)
    base = sweep_base(images_path)
    sweep = load_images(sweep_path)
    groups = json.loads(pathlib.Path(sweep_path).with_suffix(".groups.json").read_text())
    for label, indices in groups.items():
        if mma_ok and label.startswith("mma_") and label not in passed:
            logger.warning("%s: not checked or failed int4_mma_check.py; not timed", label)
            continue
        if label.startswith("shipped_"):  # a whole shipped set (prepare.py's INT4_BASELINE_REV), by the rule
            launcher = MoEExpertsLauncher([sweep[i] for i in indices])
        else:
            launcher = MoEExpertsLauncher(base + [sweep[i] for i in indices])
            launcher.set_int4_path("mma" if label.startswith("mma_") else "gemv")
        contenders[label] = int4_bench.int4_block(launcher)
    return contenders


def sweep_base(images_path: str) -> list:
    """The shipped INT4 images a swept build runs with (the route, combine, tiles and "gemv_any"), bf16 cubins: not
    the shipped "gemv" blocking nor the mma.sync builds, which the swept ones stand in for."""
    return [i for i in load_images(images_path) if i.format == "cubin" and i.dtype == "bf16"
            and i.kernel.startswith("moe_") and i.variant != "gemv" and not i.kernel.startswith("moe_mma_")
            and (i.weight_format == "int4" or i.kernel in ("moe_route", "moe_combine"))]


def bench_shape(tokens: int, experts: int, size: int, ffn: int, w, contenders: dict, et) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    hidden = torch.randn(tokens, size, device="cuda", generator=gen).bfloat16()
    ids, weights = moe_block_bench.routing(tokens, experts, int4_bench.TOP_K, tokens + experts)
    fns = {label: (lambda block=block: block(hidden, ids, weights, w.q_gate_up, w.q_down))
           for label, block in contenders.items() if label != "bf16"}
    fns["bf16"] = lambda: contenders["bf16"](hidden, ids, weights, w.blocked, w.down)
    if et is not None and tokens <= ET_MAX_TOKENS:
        fns["et_decode"] = lambda: et.fused_moe(hidden, *w.et, weights, ids.long(), int4_bench.TOP_K, experts,
                                                int4_bench.GROUP)
    want = int4_weights.moe_experts_reference(hidden, ids, weights, w.q_gate_up.packed, w.q_gate_up.scales,
                                              w.q_down.packed, w.q_down.scales, group_size=int4_bench.GROUP)
    row = {"tokens": tokens, "experts": experts, "hidden": size, "ffn": ffn, "err": {}}
    timed = {}
    for label, fn in fns.items():
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as e:  # a contender that fails is reported, the others still timed
            logger.error("%d tokens %s: %s failed: %s", tokens, (experts, size, ffn), label, e)
            continue
        if label == "shipped":
            row["shipped_kernels"] = contenders["shipped"].launcher.last_kernels
        if label != "bf16":  # bf16 runs other weights; int4_experts_bench checks it
            row["err"][label] = bench.rel_err(out, want)
            if not row["err"][label] < 2e-2:
                logger.error("%d tokens %s: %s wrong (relative error %.3e); not timed", tokens,
                             (experts, size, ffn), label, row["err"][label])
                continue
        timed[label] = fn
    row["touched_bytes"] = int(ids.unique().numel()) * w.expert_bytes
    calls = bench.replay_calls(0.004, max(row["touched_bytes"] / 2e12, 5e-6))
    graphs = {label: bench.capture(fn, calls) for label, fn in timed.items()}
    times = bench.time_rounds(graphs, calls, ROUNDS)
    row["us"] = {label: statistics.median(t) * 1e6 for label, t in times.items()}
    del graphs
    return row


TENSOR_CORE = "mma_"  # the mma.sync kernels' labels (int4_mma.py)
GAP_TOKENS = range(4, 65)  # where the shipped launcher misses 2.5x bf16 the most (h100_int4/)


def gemv_labels(row: dict) -> list[str]:
    return [label for label in row["us"] if not label.startswith("shipped") and label not in ("bf16", "et_decode")]


def table(rows: list[dict], copy_bps: float) -> str:
    lines = [f"copy bandwidth (1 GiB device-to-device, read + write): {copy_bps / 1e9:.0f} GB/s", "",
             "| E x H x F | tokens | best | us | % copy | best mma_ | us | best gemv | us | shipped us (path) | "
             "no-PDL us | no-PDL / shipped | baseline us | baseline / shipped | bf16 us | et_decode us | "
             "best x bf16 | best x et | best x shipped |",
             "|---" * 19 + "|"]
    for r in rows:
        us = r["us"]
        ranked = sorted(gemv_labels(r), key=us.get)
        if not ranked:
            continue
        best = ranked[0]
        share = r["touched_bytes"] / (us[best] * 1e-6) / copy_bps
        path = next((p for p in ("gemv", "mma") if f"moe_{p}_" in r.get("shipped_kernels", "")), "tiles")
        best_mma = next((label for label in ranked if label.startswith(TENSOR_CORE)), None)
        best_gemv = next((label for label in ranked if not label.startswith(TENSOR_CORE)), None)

        def fmt(label):
            return f"{us[label]:.1f}" if label in us else "-"

        def ratio(label):
            return f"{us[label] / us[best]:.2f}x" if label in us else "-"

        pdl_gain = f"{us['shipped_no_pdl'] / us['shipped']:.3f}" if {"shipped", "shipped_no_pdl"} <= set(us) else "-"
        baseline = next((label for label in us if label.startswith("shipped_") and label != "shipped_no_pdl"), None)
        base_gain = f"{us[baseline] / us['shipped']:.3f}" if baseline and "shipped" in us else "-"
        lines.append(f"| {r['experts']}x{r['hidden']}x{r['ffn']} | {r['tokens']} | {best} | {us[best]:.1f} | "
                     f"{100 * share:.0f}% | {best_mma} | {fmt(best_mma)} | {best_gemv} | {fmt(best_gemv)} | "
                     f"{fmt('shipped')} ({path}) | {fmt('shipped_no_pdl')} | {pdl_gain} | {fmt(baseline)} | "
                     f"{base_gain} | {fmt('bf16')} | "
                     f"{fmt('et_decode')} | {ratio('bf16')} | {ratio('et_decode')} | {ratio('shipped')} |")
    return "\n".join(lines) + "\n\n" + overall(rows)


def overall(rows: list[dict]) -> str:
    """Each blocking's geometric mean of its time over the best one's: at 4-64 tokens (the ranking's order) and
    across all shapes timed."""
    served: dict[str, list[float]] = {}
    slowdown: dict[str, list[float]] = {}
    for r in rows:
        labels = gemv_labels(r)
        if not labels:
            continue
        best = min(r["us"][label] for label in labels)
        for label in labels:
            slowdown.setdefault(label, []).append(math.log(r["us"][label] / best))
            if r["tokens"] in GAP_TOKENS:
                served.setdefault(label, []).append(math.log(r["us"][label] / best))

    def mean(logs):
        return math.exp(statistics.mean(logs)) if logs else math.nan

    ranked = sorted(slowdown, key=lambda label: (mean(served.get(label, [])), mean(slowdown[label])))
    lines = ["| blocking | mean time / best at 4-64 tokens | shapes | mean time / best, all shapes | "
             "shapes |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {mean(served.get(label, [])):.3f} | {len(served.get(label, []))} | "
              f"{mean(slowdown[label]):.3f} | {len(slowdown[label])} |" for label in ranked]
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """"8x1024x1024,16x2048x4096" -> [(8, 1024, 1024), (16, 2048, 4096)]."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not experts x hidden x ffn (e.g. 16x1024x1024)")
        shapes.append(tuple(int(part) for part in parts))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="int4_images.json from benchmarks/device/prepare.py --int4")
    parser.add_argument("--sweep", required=True, help="int4_sweep_images.json from prepare.py --int4")
    parser.add_argument("--executorch", type=pathlib.Path, help="folder holding ExecuTorch's fused_moe.py")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--mma-ok", type=pathlib.Path, help="int4_mma_check.py's --ok-file: time only those mma_")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="start no new shape after this")
    parser.add_argument("--shapes", type=parse_shapes, default=int4_bench.EXPERT_SHAPES,
                        help="experts x hidden x ffn, comma-separated (e.g. 16x1024x1024,32x1024x1024); default: "
                             "int4_experts_bench.py's robot shapes")
    parser.add_argument("--tokens", type=lambda text: [int(t) for t in text.split(",")], default=TOKENS,
                        help=f"token counts, comma-separated (default {','.join(map(str, TOKENS))})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.monotonic()
    bench.print_device()
    et = None
    if args.executorch:
        sys.path.insert(0, str(args.executorch))
        et = importlib.import_module("fused_moe")
    contenders = sweep_contenders(args.images, args.sweep, args.mma_ok)
    copy_bps = int4_bench.copy_bandwidth()
    rows = []
    for experts, size, ffn in args.shapes:
        w = int4_bench.Weights(experts, size, ffn)
        for tokens in args.tokens:
            if time.monotonic() - start > args.deadline_s:
                logger.warning("deadline: %dx%dx%d %d tokens and later not timed", experts, size, ffn, tokens)
                break
            rows.append(bench_shape(tokens, experts, size, ffn, w, contenders, et))
            logger.info("%dx%dx%d %d tok (%.0f s): %s us", experts, size, ffn, tokens, time.monotonic() - start,
                        {label: round(us, 1) for label, us in rows[-1]["us"].items()})
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "int4_gemv_sweep.md").write_text(table(rows, copy_bps) + "\n")
        del w
        torch.cuda.empty_cache()
    bench.save_results(args.out, "int4_gemv_sweep", rows, table(rows, copy_bps))


if __name__ == "__main__":
    main()
