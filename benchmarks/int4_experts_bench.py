"""INT4 experts (issue 33) on a GPU: our INT4 MoEExperts kernels against our bf16 ones and against ExecuTorch CUDA
backend's Triton fused_moe, from top-k ids to the combined output, at robot sizes; and the sm_80 images' bandwidth.

  int4       our INT4 kernels (et_trt_backend/int4_weights.py's form, group 128) through the C++ launcher
             (moe_experts_launcher.h), this GPU's cubins
  int4_sm80  the same from the sm_80 PTX images alone: the build closest to Orin's sm_87 cubins this card runs
  bf16       our bf16 MoEExperts kernels (the launcher's choice, wgmma included), gate+up rows blocked8
  et_decode  ExecuTorch's fused_moe (its vector-matrix kernel per pair) and et_batched its fused_moe_batched_gemm
             (token-sorted tensor-core kernel): .device/executorch/fused_moe.py as its authors wrote it, autotuned,
             with the same INT4 values and scales repacked into its byte order. "et" is the faster of the two per
             shape (each round's minimum), the comparator of the issue's goals.

Our kernels are AOT images run by the C++ launcher (tests/test_int4_gpu.py runs them with Triton's import blocked);
ExecuTorch's need Triton, so this process has it. Method as moe_block_bench.py: CUDA graphs of back-to-back calls,
each timed replay right after an untimed one, contenders in a fresh random order each round, ratios the medians
of the rounds' paired ratios. Every contender's output is checked against int4_weights.moe_experts_reference
(float32) before it is timed; "vs bf16" is the INT4 output's error against the bf16 weights' reference.
Bandwidth: the touched experts' packed weights and scales over int4_sm80's time, against a device-to-device copy's
(read + write bytes over its time) measured here.

    python benchmarks/int4_experts_bench.py --images .device/int4_images.json --executorch .device/executorch \
        --out results/
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)
import moe_block_bench  # noqa: E402

from et_trt_backend import int4_weights, moe_experts  # noqa: E402
from et_trt_backend.kernels.images import load_images  # noqa: E402
from et_trt_backend.kernels.launcher import MoEExpertsLauncher  # noqa: E402

logger = logging.getLogger("int4_experts_bench")

GROUP = 128
TOP_K = 2
# (experts, hidden, FFN) of the robot sizes (8-64 experts, hidden 1024-2048, FFN 1024-4096), top-2.
EXPERT_SHAPES = [(8, 1024, 1024), (64, 2048, 1024), (16, 2048, 4096)]
TOKENS = [1, 4, 16, 64, 256]
# The issue's goals: int4 over bf16 and over ExecuTorch at 1-64 tokens, over bf16 at 256; the sm_80 images'
# share of the copy bandwidth at 1-16 tokens.
GOALS = {"bf16": 2.5, "et": 1.3, "bf16_256": 1.5, "bandwidth": 0.6}


def et_packed(w: int4_weights.Int4Weights) -> torch.Tensor:
    """ExecuTorch's byte order of the same INT4 values: int8 [G, N, K / 2], element 2i in byte i's low nibble and
    2i + 1 in its high nibble, stored as q + 8."""
    stored = (int4_weights.unpack(w.packed, w.k).to(torch.int16) + 8).to(torch.uint8)
    return (stored[..., 0::2] | (stored[..., 1::2] << 4)).view(torch.int8)


def int4_block(launcher: MoEExpertsLauncher):
    """Our INT4 kernels (moe_block_bench.launch_block), gate+up rows "concat" as ExecuTorch's."""
    buffers = {}

    def block(hidden, ids, weights, gate_up: int4_weights.Int4Weights, down: int4_weights.Int4Weights):
        return moe_block_bench.launch_block(
            launcher, buffers, hidden, ids, weights, gate_up.packed, down.packed, down.k, "concat",
            w_gate_up_scale=gate_up.scales, w_down_scale=down.scales, group_size=GROUP)

    block.launcher = launcher
    return block


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write), median of CUDA-graph replays."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    graph = bench.capture(lambda: dst.copy_(src), 4)
    seconds = bench.time_interleaved({"copy": graph}, 4, 9)["copy"]
    del src, dst, graph
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / seconds


class Weights:
    """One expert shape's weights: bf16 (random, as trained weights roughly are), their INT4 form in our layout and
    in ExecuTorch's, and the bf16 ones with gate+up rows blocked8 for our bf16 kernels."""

    def __init__(self, experts: int, size: int, ffn: int):
        gen = torch.Generator(device="cuda").manual_seed(experts + size + ffn)
        self.gate_up = (torch.randn(experts, 2 * ffn, size, device="cuda", generator=gen) / size**0.5).bfloat16()
        self.down = (torch.randn(experts, size, ffn, device="cuda", generator=gen) / ffn**0.5).bfloat16()
        self.blocked, _ = moe_experts.relayout(self.gate_up, None, "concat", "blocked8")
        self.q_gate_up = int4_weights.quantize(self.gate_up, GROUP)
        self.q_down = int4_weights.quantize(self.down, GROUP)
        self.et = (et_packed(self.q_gate_up), self.q_gate_up.scales, et_packed(self.q_down), self.q_down.scales)
        self.expert_bytes = (self.q_gate_up.nbytes + self.q_down.nbytes) / experts


def bench_shape(tokens: int, experts: int, size: int, ffn: int, w: Weights, contenders: dict, et) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    hidden = torch.randn(tokens, size, device="cuda", generator=gen).bfloat16()
    ids, weights = moe_block_bench.routing(tokens, experts, TOP_K, tokens + experts)
    ids64 = ids.long()
    fns = {label: (lambda block=block: block(hidden, ids, weights, w.q_gate_up, w.q_down))
           for label, block in contenders.items() if label.startswith("int4")}
    fns["bf16"] = lambda: contenders["bf16"](hidden, ids, weights, w.blocked, w.down)
    if et is not None:
        fns["et_decode"] = lambda: et.fused_moe(hidden, *w.et, weights, ids64, TOP_K, experts, GROUP)
        fns["et_batched"] = lambda: et.fused_moe_batched_gemm(hidden, *w.et, weights, ids64, TOP_K, experts, GROUP)
    want = int4_weights.moe_experts_reference(hidden, ids, weights, w.q_gate_up.packed, w.q_gate_up.scales,
                                              w.q_down.packed, w.q_down.scales, group_size=GROUP)
    dense = moe_experts.reference(hidden, ids, weights, w.gate_up, w.down)
    row = {"tokens": tokens, "experts": experts, "hidden": size, "ffn": ffn, "err": {}, "launches": {}}
    timed = {}
    for label, fn in fns.items():
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as e:  # a contender that fails is reported, the others still timed
            logger.error("%s: %s failed: %s", row, label, e)
            continue
        row["err"][label] = bench.rel_err(out, dense if label == "bf16" else want)
        if label == "int4":
            row["vs_bf16"] = bench.rel_err(out, dense)
            row["kernels"] = contenders["int4"].launcher.last_kernels
        if not row["err"][label] < 2e-2:
            logger.error("%d tokens %s: %s wrong (relative error %.3e); not timed", tokens, (experts, size, ffn),
                         label, row["err"][label])
            continue
        if label == "int4":
            row["launches"][label] = moe_block_bench.launches(fn)
        timed[label] = fn
    touched = int(ids.unique().numel())
    row["touched_bytes"] = touched * w.expert_bytes
    calls = bench.replay_calls(0.01, max(row["touched_bytes"] / 2e12, 5e-6))
    graphs = {label: bench.capture(fn, calls) for label, fn in timed.items()}
    times = bench.time_rounds(graphs, calls, 15)
    if "et_decode" in times and "et_batched" in times:
        times["et"] = [min(d, b) for d, b in zip(times["et_decode"], times["et_batched"])]
    row["us"] = {label: statistics.median(t) * 1e6 for label, t in times.items()}
    row["x"] = {other: statistics.median(o / i for o, i in zip(times[other], times["int4"]))
                for other in ("bf16", "et", "int4_sm80") if "int4" in times and other in times}
    del graphs
    return row


def load_contenders(images_path: str) -> dict:
    images = load_images(images_path)
    torch.empty(1, device="cuda")  # the launchers load into the current CUDA context
    int4 = [i for i in images if i.kernel.startswith("moe_") and i.dtype == "bf16"
            and (i.weight_format == "int4" or i.kernel in ("moe_route", "moe_combine"))]
    dense = [i for i in images if i.kernel.startswith("moe_") and i.dtype == "bf16" and i.weight_format == "dense"]
    return {"int4": int4_block(MoEExpertsLauncher([i for i in int4 if i.format == "cubin"])),
            "int4_sm80": int4_block(MoEExpertsLauncher([i for i in int4 if i.format == "ptx"])),
            "bf16": moe_block_bench.fused_block(MoEExpertsLauncher(dense), "blocked8")}


def table(rows: list[dict], copy_bps: float) -> str:
    labels = ["int4", "int4_sm80", "bf16", "et_decode", "et_batched"]
    lines = [f"copy bandwidth (1 GiB device-to-device, read + write): {copy_bps / 1e9:.0f} GB/s", "",
             "| E x H x F | tokens | " + " | ".join(f"{label} us" for label in labels) +
             " | int4 x bf16 | int4 x et | sm80 GB/s (% copy) | int4 err vs bf16 | launches int4 | int4 kernels |",
             "|---" * (len(labels) + 8) + "|"]
    for r in rows:
        us = [f"{r['us'][label]:.1f}" if label in r["us"] else "-" for label in labels]
        x = [f"{r['x'][other]:.2f}x" if other in r["x"] else "-" for other in ("bf16", "et")]
        bw = "-"
        if "int4_sm80" in r["us"] and r["tokens"] <= 16:
            bps = r["touched_bytes"] / (r["us"]["int4_sm80"] * 1e-6)
            bw = f"{bps / 1e9:.0f} ({100 * bps / copy_bps:.0f}%)"
        lines.append(f"| {r['experts']}x{r['hidden']}x{r['ffn']} | {r['tokens']} | " + " | ".join(us) + " | " +
                     " | ".join(x) + f" | {bw} | {r.get('vs_bf16', float('nan')):.3f} | "
                     f"{r['launches'].get('int4', '-')} | {r.get('kernels', '-')} |")
    return "\n".join(lines) + "\n\n" + goals(rows, copy_bps)


def goals(rows: list[dict], copy_bps: float) -> str:
    met, missed = 0, []
    for r in rows:
        name = f"{r['experts']}x{r['hidden']}x{r['ffn']} {r['tokens']} tok"
        wanted = {"bf16": GOALS["bf16_256"]} if r["tokens"] == 256 else {"bf16": GOALS["bf16"], "et": GOALS["et"]}
        for other, bound in wanted.items():
            x = r["x"].get(other)
            if x is not None and x >= bound:
                met += 1
            else:
                missed.append(f"{name}: int4 x {other} {'-' if x is None else f'{x:.2f}'} < {bound}")
        if r["tokens"] <= 16 and "int4_sm80" in r["us"]:
            share = r["touched_bytes"] / (r["us"]["int4_sm80"] * 1e-6) / copy_bps
            if share >= GOALS["bandwidth"]:
                met += 1
            else:
                missed.append(f"{name}: sm_80 images at {100 * share:.0f}% of the copy bandwidth < 60%")
    return f"Goals: {met} met, {len(missed)} not met" + "".join(f"\n  NOT MET {m}" for m in missed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="JSON from benchmarks/device/prepare.py --int4")
    parser.add_argument("--executorch", type=pathlib.Path, help="folder holding ExecuTorch's fused_moe.py")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bench.print_device()
    et = None
    if args.executorch:
        sys.path.insert(0, str(args.executorch))
        et = importlib.import_module("fused_moe")
        logger.info("ExecuTorch fused_moe: %s", (args.executorch / "SOURCE").read_text().strip())
    contenders = load_contenders(args.images)
    copy_bps = copy_bandwidth()
    rows = []
    for experts, size, ffn in EXPERT_SHAPES:
        w = Weights(experts, size, ffn)
        for tokens in TOKENS:
            rows.append(bench_shape(tokens, experts, size, ffn, w, contenders, et))
            logger.info("%dx%dx%d %d tok: %s us", experts, size, ffn, tokens,
                        {label: round(us, 1) for label, us in rows[-1]["us"].items()})
            # The table so far: a run its time limit cuts still leaves the shapes it timed.
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "int4_experts_bench.md").write_text(table(rows, copy_bps) + "\n")
        del w
        torch.cuda.empty_cache()
    bench.save_results(args.out, "int4_experts_bench", rows, table(rows, copy_bps))


if __name__ == "__main__":
    main()
