"""The down stage of an MoE layer with FP8 experts: the SwiGLU of the gate+up output, then the down GEMM.

With expert_precision = "fp8" the lowering hands the down GEMM's FP8 GroupedMM the gate+up output itself
(lowering/fp8_swiglu.py): its row quantization computes the SwiGLU in the same pass. This times the whole
stage, x [rows, 2K] -> out [rows, N], so that the fused form and the unfused ones are compared on the same
work:

  torch_bf16      SwiGLU (one fused kernel, bf16 out) + torch._grouped_mm
  ours_bf16       SwiGLU (the same kernel) + our bf16 GroupedMM: what a bf16 export runs
  torch_fp8       our SwiGLU row quantization (the same source as ours) + torch._scaled_grouped_mm with
                  row-wise scales: torch's GEMM behind the best producer we have
  ours_fp8        SwiGLU (bf16 out) + our FP8 GroupedMM (its row quantization + GEMM): the unfused graph
  ours_fp8_fused  our FP8 GroupedMM given x (Fp8Operands.swiglu): what an FP8 export runs
  ours_fp8_try_*  tuning candidates (their images' groups, from prepare.py), run as ours_fp8_fused

The SwiGLU kernels outside our GroupedMM stand for the ones TensorRT would fuse from the graph's pointwise
ops; they are Triton kernels compiled here at run time (so Triton is imported, unlike
fp8_grouped_mm_bench.py), ours come from the AOT images through the C++ launcher. Method as
grouped_mm_bench.py: CUDA graphs of back-to-back calls, contenders interleaved in a fresh random order each
round, medians; each result is checked against the float32 reference of the unfused graph before it is timed.

    python benchmarks/fp8_swiglu_bench.py --images .device/fp8_bench_images.json --out results/
"""

from __future__ import annotations

import logging
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import grouped_mm_bench as bench  # noqa: E402  (benchmarks/, next to this file)

from et_trt_backend.kernels import quantize_rows  # noqa: E402
from et_trt_backend.kernels.launcher import Fp8Operands, fp8_workspace_bytes  # noqa: E402
from et_trt_backend.quantization import grouped_mm_fp8_reference, quantize_weights_fp8, swiglu_rows  # noqa: E402

logger = logging.getLogger("fp8_swiglu_bench")
CANDIDATE_PREFIX = "ours_fp8_try_"


@triton.jit
def _swiglu_kernel(x_ptr, h_ptr, rows, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """h = silu(x[:, :K]) * x[:, K:] in x's dtype: the SwiGLU our row quantization computes (its _block)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rm < rows)[:, None] & (rk < K)[None, :]
    h = quantize_rows._block(x_ptr, rm.to(tl.int64)[:, None] * (2 * K), rk, K, mask, SWIGLU=True)
    tl.store(h_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


def swiglu(x, h):
    rows, k = h.shape
    _swiglu_kernel[(triton.cdiv(rows, 8), triton.cdiv(k, 512))](x, h, rows, k, BLOCK_M=8, BLOCK_K=512, num_warps=4)


def quantized_rows(x, q, scale, swiglu=True):
    """Our row quantization (quantize_rows.py) of x, or of its SwiGLU (SWIGLU), for torch's GEMM."""
    rows, k = q.shape
    quantize_rows.quantize_rows_kernel[(triton.cdiv(rows, 4),)](
        x, q, scale, rows, k, BLOCK_M=4, BLOCK_K=1024, LAUNCH_DEPENDENTS=False, WHOLE_ROWS=False, SWIGLU=swiglu,
        num_warps=4)


def bench_stage(name, tokens, experts, hidden, ffn, top_k, launchers, replay_s, rounds) -> dict:
    rows, k, n = tokens * top_k, ffn, hidden
    offs = bench.routed_offsets(tokens, experts, top_k, tokens + experts).cuda()
    gen = torch.Generator(device="cuda").manual_seed(tokens + experts + hidden)
    x = torch.randn(rows, 2 * k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(experts, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
    b_q, b_scale = quantize_weights_fp8(w)
    h_ref = swiglu_rows(x)
    refs = {"bf16": torch._grouped_mm(h_ref, w.transpose(-2, -1), offs=offs).float(),
            "fp8": grouped_mm_fp8_reference(h_ref, b_q, b_scale, offs)}
    h = torch.empty(rows, k, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(rows, k, device="cuda", dtype=torch.float8_e4m3fn)
    scale = torch.empty(rows, device="cuda", dtype=torch.float32)
    candidates = [label for label in launchers if label.startswith(CANDIDATE_PREFIX)]
    outs = {label: torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            for label in ("ours_bf16", "ours_fp8", "ours_fp8_fused", *candidates)}
    workspaces = {label: torch.empty(fp8_workspace_bytes(rows, k), device="cuda", dtype=torch.uint8)
                  for label in ("ours_fp8", "ours_fp8_fused", *candidates)}

    def ours(label, a, fp8):
        launcher = launchers[label if label.startswith(CANDIDATE_PREFIX) else "ours_bf16" if fp8 is None else
                             "ours_fp8"]
        weights = w if fp8 is None else b_q
        launcher.launch(a.data_ptr(), weights.data_ptr(), offs.data_ptr(), outs[label].data_ptr(), rows, k, n,
                        experts, True, torch.cuda.current_stream().cuda_stream, fp8)  # the capturing stream

    def fp8_operands(label, fused):
        ws = workspaces[label]
        return Fp8Operands(b_scale.data_ptr(), ws.data_ptr(), ws.numel(), fused)

    fns = {
        "torch_bf16": lambda: (swiglu(x, h), torch._grouped_mm(h, w.transpose(-2, -1), offs=offs))[1],
        "ours_bf16": lambda: (swiglu(x, h), ours("ours_bf16", h, None)),
        "torch_fp8": lambda: (quantized_rows(x, q, scale), torch._scaled_grouped_mm(
            q, b_q.transpose(-2, -1), scale, b_scale, offs=offs, out_dtype=torch.bfloat16))[1],
        "ours_fp8": lambda: (swiglu(x, h), ours("ours_fp8", h, fp8_operands("ours_fp8", False))),
        "ours_fp8_fused": lambda: ours("ours_fp8_fused", x, fp8_operands("ours_fp8_fused", True)),
        **{label: lambda label=label: ours(label, x, fp8_operands(label, True)) for label in candidates},
    }
    row = {"shape": name, "rows": rows, "K": k, "N": n, "err": {}}
    for label, fn in fns.items():
        result = fn()
        torch.cuda.synchronize()
        got = outs[label] if label in outs else result
        row["err"][label] = bench.rel_err(got, refs["fp8" if "fp8" in label else "bf16"])
        if not row["err"][label] < 2e-2:
            raise AssertionError(f"{name}: {label} is off the reference by {row['err'][label]:.2e}")
    fns["ours_fp8_fused"]()  # the kernels it takes
    row["fused_kernels"] = f"{launchers['ours_fp8'].last_quantize} + {launchers['ours_fp8'].last_kernel}"
    estimate = max(2.0 * rows * k * n / 1000e12, (experts * k * n + rows * (4 * k + 2 * n)) / 4e12, 5e-6)
    calls = bench.replay_calls(replay_s, estimate)
    graphs = {label: bench.capture(fn, calls) for label, fn in fns.items()}
    row["us"] = {label: t * 1e6 for label, t in bench.time_interleaved(graphs, calls, rounds).items()}
    return row


def table(rows: list[dict]) -> str:
    lines = ["| shape | rows | K | N | torch bf16 us | ours bf16 us | torch fp8 us | ours fp8 us | ours fp8 fused us | "
             "fused x ours bf16 | fused x torch fp8 | fused x ours fp8 | fused stage's kernels |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u = r["us"]
        lines.append(f"| {r['shape']} | {r['rows']} | {r['K']} | {r['N']} | {u['torch_bf16']:.1f} | "
                     f"{u['ours_bf16']:.1f} | {u['torch_fp8']:.1f} | {u['ours_fp8']:.1f} | {u['ours_fp8_fused']:.1f} | "
                     f"{u['ours_bf16'] / u['ours_fp8_fused']:.2f}x | {u['torch_fp8'] / u['ours_fp8_fused']:.2f}x | "
                     f"{u['ours_fp8'] / u['ours_fp8_fused']:.2f}x | {r['fused_kernels']} |")
    candidates = sorted({label for r in rows for label in r["us"] if label.startswith(CANDIDATE_PREFIX)})
    if candidates:
        lines += ["", "| shape | candidate | us | ours fp8 fused us / candidate's |", "|---|---|---|---|"]
        lines += [f"| {r['shape']} | {label} | {r['us'][label]:.1f} | {r['us']['ours_fp8_fused'] / r['us'][label]:.2f}x |"
                  for r in rows for label in candidates if label in r["us"]]
    return "\n".join(lines) + bench.ratio_summary(rows, "ours_fp8_fused", ("ours_bf16", "torch_fp8", "ours_fp8"),
                                                  "stages")


def main() -> None:
    parser = bench.fp8_parser(__doc__.split("\n")[0])
    args, launchers = bench.start_fp8_bench(parser)
    rows = []
    for name, *shape in bench.layer_shapes(args.skip_robot):
        rows.append(bench_stage(name, *shape[:5], launchers, *shape[5:]))
        logger.info("%s: %s", name, {label: round(us, 1) for label, us in rows[-1]["us"].items()})
    text = table(rows)
    bench.save_results(args.out, "fp8_swiglu_bench", rows, text)


if __name__ == "__main__":
    main()
