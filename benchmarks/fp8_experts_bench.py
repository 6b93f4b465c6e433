"""The experts of an MoE layer with FP8 weights against bf16: gate+up GEMM, SwiGLU, down GEMM, together.

fp8_grouped_mm_bench.py times each GEMM alone and fp8_swiglu_bench.py the down stage; this times the three
steps as one, from the routed rows a [rows, hidden] to the experts' output [rows, hidden]: the part of an
MoE layer that expert_precision = "fp8" changes (routing, the token sort and the weighted combine are the
same either way and are left out):

  torch_bf16  torch._grouped_mm, SwiGLU (one fused kernel), torch._grouped_mm
  ours_bf16   our bf16 GroupedMM, the same SwiGLU, our bf16 GroupedMM: what a bf16 export runs
  torch_fp8   our row quantization, torch._scaled_grouped_mm (row-wise scales), our SwiGLU row
              quantization, torch._scaled_grouped_mm: torch's FP8 GEMMs behind the fastest producers we have
  ours_fp8    our FP8 GroupedMM (row quantization + GEMM), then our FP8 GroupedMM given the gate+up output
              (the SwiGLU in its row quantization, lowering/fp8_swiglu.py): what an FP8 export runs

The SwiGLU and torch's row quantizations are Triton kernels compiled here at run time, as in
fp8_swiglu_bench.py; ours come from the AOT images through the C++ launcher. Method as grouped_mm_bench.py:
CUDA graphs of back-to-back calls, contenders interleaved in a fresh random order each round, medians; each
result is checked against a float32 reference of its own chain before it is timed.

    python benchmarks/fp8_experts_bench.py --images .device/fp8_bench_images.json --out results/
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
from fp8_swiglu_bench import quantized_rows, swiglu  # noqa: E402

from et_trt_backend.kernels.launcher import Fp8Operands, fp8_workspace_bytes  # noqa: E402
from et_trt_backend.quantization import grouped_mm_fp8_reference, quantize_weights_fp8, swiglu_rows  # noqa: E402

logger = logging.getLogger("fp8_experts_bench")


def down_reference(gate_up, w2, w2_fp8, offs, fp8: bool) -> torch.Tensor:
    """float32: the down GEMM of the SwiGLU of a contender's own gate+up output, as its chain computes it
    (fp8: exact products of the quantized operands). Taking that output, not a reference's, keeps a
    one-ulp difference in it from moving a row's FP8 scale, which would move every value of the row."""
    h = swiglu_rows(gate_up)
    if fp8:
        return grouped_mm_fp8_reference(h, *w2_fp8, offs)
    return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs).float()


def bench_experts(name, tokens, experts, hidden, ffn, top_k, replay_s, rounds, launchers, sampler) -> dict:
    rows = tokens * top_k
    offs = bench.routed_offsets(tokens, experts, top_k, tokens + experts).cuda()
    gen = torch.Generator(device="cuda").manual_seed(tokens + experts + hidden)
    a = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1 = (torch.randn(experts, 2 * ffn, hidden, device="cuda", generator=gen) / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, ffn, device="cuda", generator=gen) / ffn**0.5).to(torch.bfloat16)
    (w1_q, s1), (w2_q, s2) = quantize_weights_fp8(w1), quantize_weights_fp8(w2)
    gate_up_refs = {"bf16": torch._grouped_mm(a, w1.transpose(-2, -1), offs=offs).float(),
                    "fp8": grouped_mm_fp8_reference(a, w1_q, s1, offs)}

    x = torch.empty(rows, 2 * ffn, device="cuda", dtype=torch.bfloat16)  # the gate+up output
    h = torch.empty(rows, ffn, device="cuda", dtype=torch.bfloat16)  # its SwiGLU
    a_q = torch.empty(rows, hidden, device="cuda", dtype=torch.float8_e4m3fn)
    a_scale = torch.empty(rows, device="cuda", dtype=torch.float32)
    h_q = torch.empty(rows, ffn, device="cuda", dtype=torch.float8_e4m3fn)
    h_scale = torch.empty(rows, device="cuda", dtype=torch.float32)
    outs = {label: torch.full((rows, hidden), float("nan"), device="cuda", dtype=torch.bfloat16)
            for label in ("ours_bf16", "ours_fp8")}
    gate_up_ws = torch.empty(fp8_workspace_bytes(rows, hidden), device="cuda", dtype=torch.uint8)
    down_ws = torch.empty(fp8_workspace_bytes(rows, ffn), device="cuda", dtype=torch.uint8)

    def ours(label, inp, weights, out, k, n, fp8=None):
        launchers[label].launch(inp.data_ptr(), weights.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n,
                                experts, True, torch.cuda.current_stream().cuda_stream, fp8)  # the capturing stream

    # Each returns (its gate+up output, its output).
    def ours_bf16():
        ours("ours_bf16", a, w1, x, hidden, 2 * ffn)
        swiglu(x, h)
        ours("ours_bf16", h, w2, outs["ours_bf16"], ffn, hidden)
        return x, outs["ours_bf16"]

    def ours_fp8():
        ours("ours_fp8", a, w1_q, x, hidden, 2 * ffn,
             Fp8Operands(s1.data_ptr(), gate_up_ws.data_ptr(), gate_up_ws.numel()))
        ours("ours_fp8", x, w2_q, outs["ours_fp8"], ffn, hidden,
             Fp8Operands(s2.data_ptr(), down_ws.data_ptr(), down_ws.numel(), True))
        return x, outs["ours_fp8"]

    def torch_bf16():
        gate_up = torch._grouped_mm(a, w1.transpose(-2, -1), offs=offs)
        swiglu(gate_up, h)
        return gate_up, torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)

    def torch_fp8():
        quantized_rows(a, a_q, a_scale, swiglu=False)
        gate_up = torch._scaled_grouped_mm(a_q, w1_q.transpose(-2, -1), a_scale, s1, offs=offs,
                                           out_dtype=torch.bfloat16)
        quantized_rows(gate_up, h_q, h_scale)
        return gate_up, torch._scaled_grouped_mm(h_q, w2_q.transpose(-2, -1), h_scale, s2, offs=offs,
                                                 out_dtype=torch.bfloat16)

    fns = {"torch_bf16": torch_bf16, "ours_bf16": ours_bf16, "torch_fp8": torch_fp8, "ours_fp8": ours_fp8}
    row = {"shape": name, "rows": rows, "hidden": hidden, "ffn": ffn, "err": {}}
    for label, fn in fns.items():  # each step against its reference; the bounds as the per-stage benchmarks'
        gate_up, out = fn()
        torch.cuda.synchronize()
        fp8 = "fp8" in label
        errors = (bench.rel_err(gate_up, gate_up_refs["fp8" if fp8 else "bf16"]),
                  bench.rel_err(out, down_reference(gate_up, w2, (w2_q, s2), offs, fp8)))
        row["err"][label] = max(errors)
        if not (errors[0] < 1e-2 and errors[1] < 2e-2):
            raise AssertionError(f"{name}: {label} is off its reference by {errors[0]:.2e} (gate+up), "
                                 f"{errors[1]:.2e} (down)")
    launcher = launchers["ours_fp8"]  # its last call was the down GEMM's
    row["down_kernels"] = f"{launcher.last_quantize} + {launcher.last_kernel}"
    flops = 6.0 * rows * hidden * ffn
    estimate = max(flops / 1000e12, (3 * experts * hidden * ffn + 6 * rows * (hidden + ffn)) / 4e12, 10e-6)
    calls = bench.replay_calls(replay_s, estimate)
    graphs = {label: bench.capture(fn, calls) for label, fn in fns.items()}
    started = time.monotonic()
    row["us"] = {label: t * 1e6 for label, t in bench.time_interleaved(graphs, calls, rounds).items()}
    if sampler is not None:
        row["watts"], row["sm_mhz"], _ = sampler.between(started, time.monotonic())
    del graphs
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> str:
    lines = ["| shape | rows | hidden | FFN | torch bf16 us | ours bf16 us | torch fp8 us | ours fp8 us | "
             "ours fp8 x ours bf16 | ours fp8 x torch fp8 | SM MHz, W | err ours fp8 / bf16 (worst step) | "
             "ours fp8's down GEMM |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = r["us"]
        clock = f"{r['sm_mhz']:.0f}, {r['watts']:.0f}" if "sm_mhz" in r else "n/a"
        lines.append(f"| {r['shape']} | {r['rows']} | {r['hidden']} | {r['ffn']} | {u['torch_bf16']:.1f} | "
                     f"{u['ours_bf16']:.1f} | {u['torch_fp8']:.1f} | {u['ours_fp8']:.1f} | "
                     f"{u['ours_bf16'] / u['ours_fp8']:.2f}x | {u['torch_fp8'] / u['ours_fp8']:.2f}x | {clock} | "
                     f"{r['err']['ours_fp8']:.1e} / {r['err']['ours_bf16']:.1e} | {r['down_kernels']} |")
    return "\n".join(lines) + bench.ratio_summary(rows, "ours_fp8", ("ours_bf16", "torch_fp8"), "layers")


def main() -> None:
    parser = bench.fp8_parser(__doc__.split("\n")[0])
    args, launchers = bench.start_fp8_bench(parser)
    sampler = sustained.GpuSampler().start() if sustained.GpuSampler.available() else None
    rows = []
    for name, *shape in bench.layer_shapes(args.skip_robot):
        rows.append(bench_experts(name, *shape, launchers=launchers, sampler=sampler))
        logger.info("%s: %s", name, {label: round(us, 1) for label, us in rows[-1]["us"].items()})
    if sampler is not None:
        sampler.stop()
    text = table(rows)
    bench.save_results(args.out, "fp8_experts_bench", rows, text)


if __name__ == "__main__":
    main()
