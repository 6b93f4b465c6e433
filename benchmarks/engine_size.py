"""Size of the TensorRT for RTX engines built at export: GroupedMM plugin vs dense lowering.

    python benchmarks/engine_size.py [--model example|grouped_moe]

Exports the model twice with its recipe (the example's: examples/recipe.toml), every part's
kernel_archs extended by the targets TensorRT for RTX builds for: once with the grouped-GEMM
kernel (GroupedMM plugin nodes, which serialize a 32-byte reference to the blob's kernel
images), once lowered densely (grouped_gemm_kernel = false: TensorRT-native ops, no images).
Per part and target it prints both engine sizes, the kernel images' size and
plugin / (dense + images): an engine with the plugin should cost no more than the dense
engine plus one copy of the images (the goal is <= 1.2). Needs TensorRT for RTX.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RTX_ARCHS = ["sm_80", "sm_86", "sm_89", "sm_120a"]


def _models():
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from support import moe_models
    from examples import moe_policy

    recipe = tomllib.loads((REPO / "examples" / "recipe.toml").read_text())
    return {
        "example": (moe_policy.export_policy, recipe),
        "grouped_moe": (lambda: moe_models.export(moe_models.bf16(moe_models.GroupedMoE(experts=8, shared=True))),
                        {"default": {}}),
    }


def _with(recipe: dict, grouped_gemm_kernel: bool) -> dict:
    from et_trt_backend.options import DEFAULT_KERNEL_ARCHS

    recipe = copy.deepcopy(recipe)
    for table in [recipe.setdefault("default", {}), *recipe.get("parts", {}).values()]:
        table["kernel_archs"] = list(dict.fromkeys([*table.get("kernel_archs", DEFAULT_KERNEL_ARCHS), *RTX_ARCHS]))
        table["grouped_gemm_kernel"] = grouped_gemm_kernel
        table["engine_build"] = "always"
    return recipe


def _blobs(factory, recipe) -> dict:
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_backend.serialization import blob
    from et_trt_partitioner import TensorRTPartitioner

    edge = to_edge_transform_and_lower(factory(), partitioner=[TensorRTPartitioner(recipe)])
    gm = edge.exported_program().graph_module
    parts = [blob.deserialize(m.processed_bytes) for name, m in gm.named_children() if name.startswith("lowered_module")]
    return {contents.part: contents for contents in parts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("example", "grouped_moe"), default="example")
    args = parser.parse_args()
    factory, recipe = _models()[args.model]
    plugin = _blobs(factory, _with(recipe, True))
    dense = _blobs(factory, _with(recipe, False))
    print(f"| {args.model} part | target | engine, plugin | engine, dense | kernel images | plugin / (dense + images) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for part, contents in plugin.items():
        images = sum(k.image.size for k in contents.kernels)
        dense_sizes = {e.compute_capability: e.plan.size for e in dense[part].engines}
        for engine in contents.engines:
            ratio = engine.plan.size / (dense_sizes[engine.compute_capability] + images)
            worst = max(worst, ratio)
            print(f"| {part} | sm_{engine.compute_capability} | {engine.plan.size} | "
                  f"{dense_sizes[engine.compute_capability]} | {images} | {ratio:.3f} |")
    print(f"\nlargest ratio {worst:.3f} (goal <= 1.2)")
    return 0 if worst <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
