"""Export time and .pte size: the example policy and the largest MoE test model.

    python benchmarks/export_bench.py [--runs 3] [--verbose]

Each model is exported `--runs` times through `et-trt export`'s code path
(torch.export -> partition + preprocess -> to_executorch -> write). The first
run starts with empty kernel caches (et-trt's and Triton's: the kernels are
compiled), the rest reuse them (warm); the table gives the cold time and the
median of the warm runs, per step, and the .pte size.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def _test_models_largest_first() -> list[tuple[str, Callable[[], object]]]:
    """(name, program factory) of MoE models of tests/support/moe_models.py, largest (parameter count) first."""
    sys.path.insert(0, str(REPO / "tests"))
    from support import moe_models

    candidates = {
        "MoEStack(experts=8, shared)": lambda: moe_models.MoEStack(experts=8, shared=True),
        "GroupedMoE(experts=8, groups=(4, 2), shared)": lambda: moe_models.GroupedMoE(
            experts=8, groups=(4, 2), scoring="sigmoid", shared=True),
        "transformers DeepseekV3MoE": lambda: moe_models.hf_moe_block("deepseek_v3"),
        "transformers Qwen3MoeSparseMoeBlock": lambda: moe_models.hf_moe_block("qwen3_moe"),
    }
    sizes = {name: sum(p.numel() for p in build().parameters()) for name, build in candidates.items()}
    return [
        (f"tests/support/moe_models.py {name}, {sizes[name]} params",
         lambda build=candidates[name]: moe_models.export(moe_models.bf16(build())))
        for name in sorted(sizes, key=sizes.get, reverse=True)
    ]


def _bench(name: str, factory, recipe: Path | None, runs: int) -> tuple[dict, dict]:
    """(cold results, median warm results) of `runs` exports with a fresh kernel cache."""
    from et_trt_partitioner.export import export

    with tempfile.TemporaryDirectory() as tmp:
        # Empty kernel caches (et-trt's and Triton's) for this model: the first export compiles.
        os.environ["ET_TRT_KERNEL_CACHE"] = str(Path(tmp) / "kernels")
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
        results = []
        for run in range(runs):
            results.append(export(factory, recipe, Path(tmp) / "model.pte", name=name))
            print(f"{name}: run {run + 1}/{runs}: {results[-1]['total_s']:.1f} s", file=sys.stderr)
    warm = results[1:] or results
    # The figures only: export() also returns the data files and the export report.
    figures = [k for k, v in results[0].items() if isinstance(v, (int, float))]
    return results[0], {k: statistics.median(r[k] for r in warm) for k in figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="exports per model (first cold, rest warm)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    from et_trt_partitioner import cli

    rows, failures = [], []
    example = ("examples/moe_policy.py, recipe.toml", cli.load_factory(cli.EXAMPLE_MODULE), cli.EXAMPLE_RECIPE)
    rows.append((example[0], *_bench(*example, args.runs)))
    # The largest test model that exports; larger ones that fail are reported, not hidden.
    for name, factory in _test_models_largest_first():
        try:
            rows.append((name, *_bench(name, factory, None, args.runs)))
            break
        except Exception as e:  # noqa: BLE001 - reported below, then the next model is tried
            failures.append(f"{name}: {type(e).__name__}: {e}")

    steps = ("torch_export_s", "lower_s", "to_executorch_s", "total_s")
    print(f"\nexport time in seconds (cold = first run, empty kernel caches; warm = median of {max(args.runs - 1, 1)})")
    header = f"| model | .pte size | {' | '.join(f'{s[:-2]} cold / warm' for s in steps)} |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, cold, warm in rows:
        size = f"{cold['pte_bytes'] / 2**20:.2f} MiB"
        cells = " | ".join(f"{cold[s]:.1f} / {warm[s]:.1f}" for s in steps)
        print(f"| {name} | {size} | {cells} |")
    for failure in failures:
        print(f"\nexport FAILED (larger model, skipped): {failure.splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
