"""The fused MoE experts kernels on the CPU machine: their semantics in Triton's interpreter against
moe_experts.reference, and their AOT images for every default architecture (resources, SASS). The GPU side is
tests/test_moe_experts_gpu.py."""

import collections
import os
import pathlib
import re
import subprocess
import sys

import pytest

from et_trt_backend import options
from et_trt_backend.kernels import moe_aot

triton = pytest.importorskip("triton", reason="the MoE kernels are Triton source")

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# Shared memory a block may opt in to, per compute capability (KiB).
_SHARED_KIB = {80: 163, 87: 163, 90: 227, 100: 227, 110: 227, 120: 99}

pytestmark = pytest.mark.usefixtures("kernel_cache")  # tests/conftest.py


def test_kernels_in_triton_interpreter():
    """Every activation and gate+up layout, biases, float16 routing weights, odd H and F, one token, skewed
    routing with empty experts and invalid ids, several route programs, E below its E_PAD: the four kernels
    against the reference, every buffer poisoned (tests/moe_interpreter_check.py)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "moe_interpreter_check.py")], capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0 and "interpreter ok" in result.stdout, (result.stdout + result.stderr)[-3000:]


def _sass_ops(image, tmp_path) -> collections.Counter:
    path = tmp_path / f"{image.kernel}_{image.variant}_{image.arch}.cubin"
    path.write_bytes(image.image.bytes())
    sass = subprocess.run([BIN / "cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    return collections.Counter(m.split(".")[0] for m in re.findall(
        r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]+)", sass, re.M))


@pytest.mark.parametrize("arch", options.DEFAULT_KERNEL_ARCHS)
def test_every_default_arch_compiles(arch, tmp_path):
    images = moe_aot.moe_experts_images([arch], "bf16")
    cubins = [i for i in images if i.format == "cubin"]
    names = collections.Counter(i.kernel for i in cubins)
    configs = len(moe_aot.MOE_GEMM_CONFIGS)
    assert names == {"moe_route": len(moe_aot.MOE_ROUTE_CONFIGS), "moe_gate_up": configs,
                     "moe_gate_up_gated": configs, "moe_down": configs, "moe_combine": 1}
    cap = int(arch.removeprefix("sm_").rstrip("a"))
    for image in cubins:
        assert image.image.bytes()[:4] == b"\x7fELF" and image.dtype == "bf16" and not image.persistent
        assert image.arch == (f"sm_{cap}a" if cap >= 90 else f"sm_{cap}")
        assert image.global_scratch_bytes == 0  # no device-side TMA descriptors: no scratch to pass
        assert image.shared_bytes <= _SHARED_KIB[cap] * 1024, (image.kernel, image.variant, image.shared_bytes)
        ops = _sass_ops(image, tmp_path)
        assert ops["LDL"] == ops["STL"] == 0, f"{image.kernel} {image.variant}: registers spill to local memory"
        if cap == 90 and image.block_m >= 64:
            assert ops["HGMMA"] > 0, f"{image.kernel} {image.variant}: no wgmma in the sm_90a SASS"
    ptx = [i for i in images if i.format == "ptx"]
    assert {i.arch for i in ptx} == {"sm_80"} and len(ptx) == len(cubins)


def test_ptx_is_pinned_to_a_version_current_drivers_accept():
    for image in moe_aot.moe_experts_images([], "fp16"):
        version = re.search(r"^\.version (\d+)\.(\d+)$", image.image.bytes().decode(), re.M)
        assert version and f"{version[1]}.{version[2]}" == image.ptx_version == "8.0"


def test_bad_arch_and_dtype_are_named():
    with pytest.raises(ValueError, match="sm_75"):
        moe_aot.moe_experts_images(["sm_75"], "bf16")
    with pytest.raises(ValueError, match="fp32"):
        moe_aot.moe_experts_images(["sm_90a"], "fp32")
