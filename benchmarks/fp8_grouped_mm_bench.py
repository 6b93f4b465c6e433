"""FP8 grouped-GEMM benchmark: ours (row quantization + FP8 GEMM, as the export embeds them) against
torch._scaled_grouped_mm with row-wise scales, our bf16 kernel and torch._grouped_mm.

Same method as grouped_mm_bench.py (whose helpers it uses): no Triton in the process, AOT images
launched through the C++ launcher, CUDA graphs of back-to-back calls, contenders interleaved in
a fresh random order each round, the median per contender; each result is checked before it is
timed. Weights are quantized once (as at export); activations are bf16.

Contenders:
  torch_bf16        torch._grouped_mm
  ours_bf16         our bf16 kernel (the images a bf16 export embeds)
  torch_fp8         torch._scaled_grouped_mm on activations quantized beforehand (the GEMM alone:
                    a lower bound for torch, which would need a row quantization too)
  torch_fp8_fast    the same with use_fast_accum=True (no promotion of the partial sums)
  torch_fp8_quant   what PyTorch runs: the row quantization in eager ops, then torch_fp8
  ours_fp8          one launch of our fp8 images: the row quantization, then the GEMM the launcher picks
  ours_fp8_wgmma    the same with the sm_90a wgmma kernel only; ours_fp8_triton: Triton's only
  ours_fp8_try_*    tuning candidates prepare.py adds (another row quantization's blocking, ...)

    python benchmarks/fp8_grouped_mm_bench.py --images .device/fp8_bench_images.json --out results/
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)
import sustained  # noqa: E402

from et_trt_backend.kernels.launcher import (  # noqa: E402
    Fp8Operands,
    GroupedMMLauncher,
    fp8_workspace_bytes,
)
from et_trt_backend.quantization import (  # noqa: E402
    grouped_mm_fp8_reference,
    quantize_rows_fp8,
    quantize_weights_fp8,
)

logger = logging.getLogger("fp8_grouped_mm_bench")

FP8_PREFIX = "ours_fp8"  # every contender so named launches FP8 images
CANDIDATE_PREFIX = "ours_fp8_try_"  # tuning candidates: listed beside ours_fp8, not in the table
SUSTAINED = ("torch_fp8_fast", "ours_bf16", "ours_fp8")


def fp8_launch_fn(launcher: GroupedMMLauncher, a, b_q, b_scale, offs, out, workspace):
    rows, k = a.shape
    n = b_q.shape[1]

    def run():  # holds the tensors, workspace included, for as long as the call (and its graph) lives
        launcher.launch(a.data_ptr(), b_q.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, b_q.shape[0], True,
                        torch.cuda.current_stream().cuda_stream,
                        Fp8Operands(b_scale.data_ptr(), workspace.data_ptr(), workspace.numel()))

    return run


def _scaled_with_quantization(a, b_q_t, b_scale, offs):
    a_q, a_scale = quantize_rows_fp8(a)
    return torch._scaled_grouped_mm(a_q, b_q_t, a_scale, b_scale, offs=offs, out_dtype=torch.bfloat16)


def kernel_split(fn, calls: int = 20) -> dict[str, float]:
    """Mean device time per call, us, of each kernel fn launches (CUPTI through torch.profiler): how an fp8 call
    divides between the row quantization and the GEMM. With the launch overlap (sm_90+) the GEMM's time
    includes its wait for the quantization."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


def bench_shape(name, tokens, experts, k, n, top_k, launchers, seed, replay_s, rounds, sampler, sustained_s):
    offs = bench.routed_offsets(tokens, experts, top_k, seed).cuda()
    rows = tokens * top_k
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(experts, n, k, device="cuda", dtype=torch.float32, generator=gen) / k**0.5).to(torch.bfloat16)
    b_q, b_scale = quantize_weights_fp8(w)
    a_q, a_scale = quantize_rows_fp8(a)
    flops = 2.0 * rows * k * n
    estimate = max(flops / 1000e12, (experts * k * n + rows * (k + 2 * n)) / 4e12, 5e-6)
    calls = bench.replay_calls(replay_s, estimate)
    ref_bf16 = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    ref_fp8 = grouped_mm_fp8_reference(a, b_q, b_scale, offs)
    b_q_t = b_q.transpose(-2, -1)  # [G, K, N] column-major, as _scaled_grouped_mm takes it
    # label: (call, its output buffer or None where the call returns it, reference)
    fns = {
        "torch_bf16": (lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), None, ref_bf16),
        "torch_fp8": (lambda: torch._scaled_grouped_mm(a_q, b_q_t, a_scale, b_scale, offs=offs,
                                                       out_dtype=torch.bfloat16), None, ref_fp8),
        "torch_fp8_fast": (lambda: torch._scaled_grouped_mm(a_q, b_q_t, a_scale, b_scale, offs=offs,
                                                            out_dtype=torch.bfloat16, use_fast_accum=True),
                           None, ref_fp8),
        # What PyTorch runs for an FP8 MoE layer: the row quantization in eager ops, then the GEMM.
        "torch_fp8_quant": (lambda: _scaled_with_quantization(a, b_q_t, b_scale, offs), None, ref_fp8),
    }
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fns["ours_bf16"] = (bench.launch_fn(launchers["ours_bf16"], a, w, offs, out), out, ref_bf16)
    for label in (label for label in launchers if label.startswith(FP8_PREFIX)):
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        workspace = torch.empty(fp8_workspace_bytes(rows, k), device="cuda", dtype=torch.uint8)
        fns[label] = (fp8_launch_fn(launchers[label], a, b_q, b_scale, offs, out, workspace), out, ref_fp8)
    row = {"shape": name, "tokens": tokens, "experts": experts, "rows": rows, "K": k, "N": n, "calls": calls}
    graphs = {}
    for label, (fn, out, ref) in fns.items():
        try:
            returned = fn()
            torch.cuda.synchronize()
        except RuntimeError as e:  # torch's kernels refuse some shapes (alignment): that contender sits out
            logger.error("%s %s: %s; not timed", name, label, str(e).splitlines()[0])
            row[f"{label}_err"] = float("nan")
            continue
        row[f"{label}_err"] = bench.rel_err(returned if out is None else out, ref)
        if label in launchers:  # fp8: "<its row quantization> + <its GEMM>"
            launcher = launchers[label]
            row[f"{label}_kernel"] = " + ".join(name for name in (launcher.last_quantize, launcher.last_kernel) if name)
        if not row[f"{label}_err"] < 1e-2:
            logger.error("%s %s: wrong result (relative error %.3e); not timed", name, label, row[f"{label}_err"])
            continue
        graphs[label] = bench.capture(fn, calls)
    row["fp8_vs_bf16_err"] = bench.rel_err(ref_fp8, ref_bf16)  # what FP8 itself costs in accuracy
    row["kernels_us"] = {label: kernel_split(fns[label][0]) for label in graphs if label.startswith(FP8_PREFIX)}
    started = time.monotonic()
    times = bench.time_interleaved(graphs, calls, rounds)
    if sampler is not None:
        row["watts"], row["sm_mhz"], _ = sampler.between(started, time.monotonic())
    row["us"] = {label: times[label] * 1e6 for label in times}
    row["tflops"] = {label: flops / t / 1e12 for label, t in times.items()}
    if sampler is not None and sustained_s > 0:
        row["sustained"] = {}
        for label in SUSTAINED:
            if label in graphs:
                r = sustained.run(graphs[label], calls, sustained_s, sampler)
                r["tflops"] = flops / r["s_per_call"] / 1e12
                row["sustained"][label] = r
    del graphs, fns
    torch.cuda.empty_cache()
    return row


def ratio(row: dict, x: str, y: str) -> str:
    us = row["us"]
    return f"{us[y] / us[x]:.2f}x" if x in us and y in us else "n/a"


def table(rows: list[dict]) -> str:
    lines = [("| shape | rows | K | N | torch bf16 us | ours bf16 us | torch fp8 us (fast; +quant) | ours fp8 us | "
              "ours fp8 x torch fp8 (x fast) | ours fp8 x ours bf16 | wgmma only / Triton only us | kernel | "
              "err fp8 (vs bf16) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        def cell(label, us=row["us"]):
            return f"{us[label]:.1f}" if label in us else "n/a"

        lines.append(
            f"| {row['shape']} | {row['rows']} | {row['K']} | {row['N']} | {cell('torch_bf16')} | {cell('ours_bf16')} | "
            f"{cell('torch_fp8')} ({cell('torch_fp8_fast')}; {cell('torch_fp8_quant')}) | {cell('ours_fp8')} | "
            f"{ratio(row, 'ours_fp8', 'torch_fp8')} ({ratio(row, 'ours_fp8', 'torch_fp8_fast')}) | "
            f"{ratio(row, 'ours_fp8', 'ours_bf16')} | {cell('ours_fp8_wgmma')} / {cell('ours_fp8_triton')} | "
            f"{row.get('ours_fp8_kernel', '')} | {row['ours_fp8_err']:.1e} ({row['fp8_vs_bf16_err']:.1e}) |")
    return "\n".join(lines)


def main() -> None:
    parser = bench.fp8_parser(__doc__.split("\n")[0])
    parser.add_argument("--sustained", type=float, default=0.0, metavar="S",
                        help=f"also run {', '.join(SUSTAINED)} alone for S seconds each at the large shapes")
    args, launchers = bench.start_fp8_bench(parser)
    sampler = sustained.GpuSampler().start() if sustained.GpuSampler.available() else None
    rows = []
    for prefix, tokens, experts, hidden, ffn, top_k, replay_s, rounds in bench.layer_shapes(args.skip_robot):
        for gemm, k, n in (("gate_up", hidden, 2 * ffn), ("down", ffn, hidden)):
            name = f"{prefix} {gemm}"
            large = not prefix.startswith("robot")
            rows.append(bench_shape(name, tokens, experts, k, n, top_k, launchers, tokens + experts, replay_s, rounds,
                                    sampler, args.sustained if large else 0.0))
            logger.info("%s: %s", name, {k: round(v, 1) for k, v in rows[-1]["us"].items()})
    if sampler is not None:
        sampler.stop()
    text = table(rows)
    large = [r for r in rows if not r["shape"].startswith("robot")]
    text += bench.ratio_summary(rows, "ours_fp8", ("torch_fp8", "torch_fp8_fast", "torch_fp8_quant", "ours_bf16"),
                                "GEMMs")
    if any("sm_mhz" in r for r in rows):
        text += "\nSM clock / power while timing (median over each shape's rounds): " + ", ".join(
            f"{r['shape']} {r['sm_mhz']:.0f} MHz {r['watts']:.0f} W" for r in large if "sm_mhz" in r)
    split = [r for r in rows if r.get("kernels_us", {}).get("ours_fp8")]
    if split:
        text += ("\n\nours_fp8's kernels, mean device time per call (CUPTI; the GEMM's includes its wait for the "
                 "quantization):")
        for r in split:
            text += f"\n- {r['shape']}: " + ", ".join(f"{k} {v:.1f} us" for k, v in r["kernels_us"]["ours_fp8"].items())
    candidates = sorted({label for r in rows for label in r["us"] if label.startswith(CANDIDATE_PREFIX)})
    if candidates:  # tuning runs: each candidate's time beside ours_fp8's, measured in the same rounds
        text += ("\n\n| shape | candidate | us | ours fp8 us / candidate's | its row quantization us (ours') |"
                 "\n|---|---|---|---|---|")
        for r in rows:
            for label in candidates:
                if label in r["us"]:
                    quantize = {c: next((v for k, v in r["kernels_us"].get(c, {}).items() if "quantize" in k), 0.0)
                                for c in (label, "ours_fp8")}
                    text += (f"\n| {r['shape']} | {label} | {r['us'][label]:.1f} | {ratio(r, label, 'ours_fp8')} | "
                             f"{quantize[label]:.1f} ({quantize['ours_fp8']:.1f}) |")
    steady = [r for r in rows if r.get("sustained")]
    if steady:
        text += "\n\n| shape | contender | sustained TFLOP/s | SM MHz | W |\n|---|---|---|---|---|"
        for r in steady:
            for label, s in r["sustained"].items():
                text += f"\n| {r['shape']} | {label} | {s['tflops']:.1f} | {s['sm_mhz']:.0f} | {s['watts']:.0f} |"
    bench.save_results(args.out, "fp8_grouped_mm_bench", rows, text)


if __name__ == "__main__":
    main()
