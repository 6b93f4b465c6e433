"""Experts routed by a token type: the authors' masked rows vs the dense form et-trt lowers them to.

WALL-OSS's SparseMoeBlock (tests/support/moe_models.TokenTypeMoE) runs each expert on the rows its mask selects
(boolean indexing, torch.where, index_put: a host sync per expert for the row count); partitioner/
masked_rows.py rewrites that into each expert on every row, selected by torch.where(mask) (the graph
`rewrite_for_edge` gives, run here eagerly, is the one the export lowers). This times both in eager
PyTorch, on the CPU or a GPU, at a scaled WALL-OSS shape (2 experts, the second half as wide, a quarter of
the tokens of type 1), and checks that they agree. It measures PyTorch's kernels, not a TensorRT engine:
how much the dense form's extra multiply-adds cost against the masked form's gathers, scatters and syncs.

    python benchmarks/token_type_moe_bench.py [--device cuda] [--hidden 512 --ffn 1408]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from et_trt_partitioner.pre_edge_rewrites import rewrite_for_edge  # noqa: E402
from support import moe_models  # noqa: E402


def _time(fn, *args, device: str, repeats: int = 20) -> float:
    """Median seconds of one call."""
    times = []
    for _ in range(repeats + 3):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=1408)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    torch.manual_seed(0)
    authors = moe_models.TokenTypeMoE(dim_inputs=(args.hidden, args.hidden // 2), ffns=(args.ffn, args.ffn // 2),
                                      skip_empty=True).eval()
    rewrite = moe_models.TokenTypeMoE(dim_inputs=authors.dim_inputs, ffns=(args.ffn, args.ffn // 2))
    rewrite.load_state_dict(authors.state_dict())
    example = (torch.randn(1, 8, args.hidden), torch.zeros(1, 8, dtype=torch.int64))
    tokens = torch.export.Dim("tokens", min=2, max=max(args.tokens))
    with torch.no_grad():
        exported = torch.export.export(rewrite.eval(), example, dynamic_shapes=({1: tokens}, {1: tokens}))
    dense = rewrite_for_edge(exported).module().to(args.device)
    authors = authors.to(args.device)

    rows = []
    with torch.no_grad():
        for n in args.tokens:
            x = torch.randn(1, n, args.hidden, device=args.device)
            types = (torch.rand(1, n, device=args.device) < 0.25).long()
            torch.testing.assert_close(dense(x, types), authors(x, types), rtol=1e-4, atol=1e-4)
            masked_s = _time(authors, x, types, device=args.device)
            dense_s = _time(dense, x, types, device=args.device)
            rows.append((n, masked_s * 1e3, dense_s * 1e3, dense_s / masked_s))
    print(f"\n{args.device}, hidden {args.hidden}, FFN {args.ffn} / {args.ffn // 2}, 2 experts, 25% type-1 tokens")
    print("| tokens | masked rows (authors), ms | dense where (et-trt's form), ms | dense / masked |")
    print("|---|---|---|---|")
    for n, masked_ms, dense_ms, ratio in rows:
        print(f"| {n} | {masked_ms:.3f} | {dense_ms:.3f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
