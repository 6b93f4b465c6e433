"""Exports are reproducible: the same model and options give the same .pte from any checkout.

Content ids key engine caches on robots, so they must depend on the model and its
options only. A copy of this checkout in another folder exports the example policy
with fresh kernel and Triton caches (so its kernel images are compiled anew), and
its .pte must be byte-identical to this checkout's export with the kernel cache the
setup warmed.

Both exports take the example's recipe with fewer kernel architectures: the decoder's
sm_90a, the velocity's sm_80. The example's own (nine architecture x dtype sets,
four nvcc builds) made this test 458 CPU-seconds; these still run every compiler and
output an export holds: Triton's cubins (for both architectures) and its portable
sm_80 PTX, nvcc's sm_90a wgmma MoE down build, and a TensorRT for RTX engine (sm_80).
The other architectures are other targets of the same compilers. The decoder's other
nvcc build, the MoE gate+up (117 of the test's 213 CPU-seconds, 2026-12-06), is put
in the cold cache from the warm one: it is the same source file built by the same
command but for one -D define (sm90.compile_cubin), so the down build, compiled cold
in the other checkout, is the proof that nvcc's output does not depend on where it ran.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from et_trt_backend.kernels import sm90
from et_trt_backend.kernels.images import CACHE_ENV, load_images

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("et_trt_backend", "partitioner", "examples")
EXAMPLE_DECODER_ARCHS = 'kernel_archs = ["sm_87", "sm_90a", "sm_110a"]'


def _recipe(where: pathlib.Path) -> pathlib.Path:
    """The example's recipe with the decoder's kernel images for sm_90a and the velocity's for sm_80."""
    text = (REPO / "examples" / "recipe.toml").read_text()
    assert EXAMPLE_DECODER_ARCHS in text, "the example recipe's decoder archs changed: update this test"
    text = text.replace(EXAMPLE_DECODER_ARCHS, 'kernel_archs = ["sm_90a"]')
    text = text.replace("[default]\n", '[default]\nkernel_archs = ["sm_80"]\n', 1)
    path = where / "recipe.toml"
    path.write_text(text)
    return path


def _checkout_copy(where: pathlib.Path) -> pathlib.Path:
    """The package sources and the example, copied to `where`; et_trt_partitioner importable from it."""
    for name in SOURCES:
        shutil.copytree(REPO / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    (where / "et_trt_partitioner").symlink_to(where / "partitioner")
    return where


def _seed_gate_up_build(cache: pathlib.Path, monkeypatch) -> None:
    """The decoder's nvcc gate+up MoE build (sm90.image's, from the warm cache; built now if absent) into `cache`,
    under the key an export looks it up by."""
    warm = sm90.image("bf16", moe="gate_up")
    with monkeypatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        patch.setattr(sm90, "compile_cubin", lambda *args, **kwargs: warm.image.bytes())
        sm90.image("bf16", moe="gate_up")


def _export(checkout: pathlib.Path, recipe: pathlib.Path, output: pathlib.Path,
            cold_cache: pathlib.Path | None) -> bytes:
    """`et-trt export` of the example with `recipe`, run from `checkout`'s sources; with the kernel cache
    `cold_cache` and a fresh Triton cache inside the checkout if given, else with the kernel cache the setup
    warmed."""
    from et_trt_backend import runtime

    # A copy holds the Python sources only: its engines come from this checkout's C++ builder.
    env = {**os.environ, "PYTHONPATH": str(checkout), runtime.PLUGIN_LIBRARY_ENV: str(runtime.plugin_library_path())}
    if cold_cache is not None:
        env.update(ET_TRT_KERNEL_CACHE=str(cold_cache), TRITON_CACHE_DIR=str(checkout / "triton_cache"))
    code = ("import et_trt_backend, et_trt_partitioner, sys\n"
            f"assert et_trt_backend.__file__.startswith({str(checkout)!r}), et_trt_backend.__file__\n"
            f"assert et_trt_partitioner.__file__.startswith({str(checkout)!r}), et_trt_partitioner.__file__\n"
            "from et_trt_partitioner import cli\n"
            f"sys.exit(cli.main(['-q', 'export', '--recipe', {str(recipe)!r}, '--output', {str(output)!r}]))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return output.read_bytes()


@pytest.mark.slow
def test_a_cold_export_in_another_checkout_gives_the_same_bytes(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path)
    checkout = _checkout_copy(tmp_path / "somewhere" / "else" / "checkout")
    cold_cache = checkout / "kernel_cache"
    if sm90.nvcc_path() is not None:
        _seed_gate_up_build(cold_cache, monkeypatch)
    seeded = set(cold_cache.glob("*.json"))
    cold = _export(checkout, recipe, tmp_path / "cold.pte", cold_cache)
    warm = _export(REPO, recipe, tmp_path / "warm.pte", None)
    from et_trt_backend.serialization.pte import read_partitions

    partitions = {p.contents.part: p.contents for p in read_partitions(cold)}
    # What the comparison covers: Triton's cubins and PTX, nvcc's cubins where nvcc is installed, an engine.
    images = {part: {(k.arch, k.format) for k in c.kernels} for part, c in partitions.items()}
    assert images == {"decoder": {("sm_90a", "cubin"), ("sm_80", "ptx")},
                      "velocity": {("sm_80", "cubin"), ("sm_80", "ptx")}}, images
    if sm90.nvcc_path() is not None:
        assert {k.kernel for k in partitions["decoder"].kernels if k.variant == "wgmma"} == {
            "moe_gate_up_gated", "moe_down"}, partitions["decoder"].kernels
        # The export used the seeded gate+up build and compiled everything else (the down build among it) anew.
        assert len(seeded) == 1 and seeded < set(cold_cache.glob("*.json")), seeded
        built_cold = [i for path in set(cold_cache.glob("*.json")) - seeded for i in load_images(path)]
        assert {i.kernel for i in built_cold if i.variant == "wgmma"} == {"moe_down"}, built_cold
    assert [e.compute_capability for e in partitions["velocity"].engines] == [80], partitions["velocity"].engines
    if cold != warm:
        differing = []
        for a, b in zip(partitions.values(), (p.contents for p in read_partitions(warm))):
            differing += [f"{a.part}: onnx"] if a.onnx != b.onnx else []
            differing += [f"{a.part}: {k.kernel} {k.arch} {k.format}" for k, j in zip(a.kernels, b.kernels)
                          if k.image != j.image]
            differing += [f"{a.part}: engine sm_{e.compute_capability}" for e, f in zip(a.engines, b.engines)
                          if e.plan != f.plan]
        pytest.fail(f"the exports differ: {differing or 'outside the blobs'}")
