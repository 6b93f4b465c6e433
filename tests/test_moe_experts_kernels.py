"""The fused MoE experts kernels on the CPU machine: their semantics in Triton's interpreter against
moe_experts.reference, and their AOT images for every default architecture (resources, SASS). The GPU side is
tests/test_moe_experts_gpu.py."""

import collections
import ctypes.util
import os
import pathlib
import re
import shutil
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
    cap = int(arch.removeprefix("sm_").rstrip("a"))
    # sm_90a: the wgmma GEMMs (sm90.py), their gather, and the combine of the wgmma down's rows in bf16
    sm90 = cap == 90 and moe_aot.sm90.nvcc_path() is not None
    assert names == {"moe_route": len(moe_aot.MOE_ROUTE_CONFIGS), "moe_gate_up": configs,
                     "moe_gate_up_gated": configs + sm90, "moe_down": configs + sm90, "moe_combine": 1 + sm90,
                     **({"moe_gather": 1} if sm90 else {})}
    # y_in_dtype: the wgmma down writes its rows in bf16 and one combine reads them so; every other down and
    # combine keeps float32 rows.
    assert {(i.kernel, i.variant) for i in cubins if i.y_in_dtype} == (
        {("moe_down", "wgmma"), ("moe_combine", "y_in_dtype")} if sm90 else set())
    for image in cubins:
        wgmma = image.variant == "wgmma"
        assert image.image.bytes()[:4] == b"\x7fELF" and image.dtype == "bf16" and image.persistent == wgmma
        assert image.arch == (f"sm_{cap}a" if cap >= 90 else f"sm_{cap}")
        assert image.global_scratch_bytes == 0  # no device-side TMA descriptors: no scratch to pass
        assert image.shared_bytes <= _SHARED_KIB[cap] * 1024, (image.kernel, image.variant, image.shared_bytes)
        ops = _sass_ops(image, tmp_path)
        assert ops["LDL"] == ops["STL"] == 0, f"{image.kernel} {image.variant}: registers spill to local memory"
        if cap == 90 and image.block_m >= 64:
            assert ops["HGMMA"] > 0, f"{image.kernel} {image.variant}: no wgmma in the sm_90a SASS"
    ptx = [i for i in images if i.format == "ptx"]
    assert {i.arch for i in ptx} == {"sm_80"} and len(ptx) == len(cubins) - 4 * sm90


def test_ptx_is_pinned_to_a_version_current_drivers_accept():
    for image in moe_aot.moe_experts_images([], "fp16"):
        version = re.search(r"^\.version (\d+)\.(\d+)$", image.image.bytes().decode(), re.M)
        assert version and f"{version[1]}.{version[2]}" == image.ptx_version == "8.0"


def test_bad_arch_and_dtype_are_named():
    with pytest.raises(ValueError, match="sm_75"):
        moe_aot.moe_experts_images(["sm_75"], "bf16")
    with pytest.raises(ValueError, match="fp32"):
        moe_aot.moe_experts_images(["sm_90a"], "fp32")


def test_launcher_library_exports_the_moe_abi(launcher_library):
    shared = launcher_library / "libet_trt_grouped_mm.so"
    exported = subprocess.run(["nm", "-D", "--defined-only", shared], capture_output=True, text=True, check=True).stdout
    for symbol in ("create", "launch", "workspace_bytes", "set_gemm_path", "set_int4_path", "set_programmatic_launch",
                   "rule_path", "last_kernels", "destroy"):
        assert f"et_trt_moe_experts_{symbol}" in exported


# (tokens, top_k, experts, H = F) -> the faster path on an H100 (benchmarks/results/h100_gate_up_epilogue/
# moe_sweep.md: shipped Triton tilings / shipped wgmma build in parentheses), and the sizes around the rule's
# thresholds. Not listed: the rule's misses and ties (the launcher's comment names them).
_MEASURED_PATHS = {
    (3500, 8, 128, 3072): "wgmma",  # 1.50
    (512, 8, 128, 3072): "wgmma",  # 32 rows per expert: 1.09
    (8740, 8, 128, 3072): "wgmma",  # 1.55
    (3500, 8, 128, 2048): "wgmma",  # 219 rows per expert: 1.39
    (16384, 2, 64, 2048): "wgmma",  # 512 rows per expert: 1.45
    (4096, 2, 64, 2048): "wgmma",  # 128 rows per expert: 1.09
    (2048, 2, 8, 2048): "wgmma",  # 512 rows per expert: 1.06
    (1024, 2, 64, 2048): "tilings",  # 32 rows per expert: 0.98
    (256, 2, 8, 2048): "tilings",  # 64 rows per expert: 0.85
    (1024, 2, 8, 1024): "tilings",  # 256 rows per expert: 0.72
    (255, 8, 128, 3072): "tilings",  # 15.9 rows per expert: too few (not measured)
    (128, 2, 8, 2560): "wgmma",  # the thresholds themselves: 2560 and 32 rows per expert,
    (127, 2, 8, 2560): "tilings",
    (128, 2, 8, 2552): "tilings",
    (512, 2, 8, 2048): "wgmma",  # 2048 and 128 rows per expert (a tie, 1.00)
    (511, 2, 8, 2048): "tilings",
    (512, 2, 8, 2040): "tilings",
}


def test_dispatch_rule_follows_the_h100_sweep(launcher_library, monkeypatch):
    """The launcher's dispatch rule, asked through the C ABI with no GPU, takes the path the H100 sweep measured
    faster; ffn alone below the size threshold, no pairs and no experts take the Triton tilings."""
    from et_trt_backend.kernels import launcher

    monkeypatch.setenv(launcher.LIBRARY_ENV, str(launcher_library / "libet_trt_grouped_mm.so"))
    monkeypatch.setattr(launcher, "_lib", None)
    got = {shape: launcher.moe_rule_path(*shape, shape[-1]) for shape in _MEASURED_PATHS}
    assert got == _MEASURED_PATHS
    assert launcher.moe_rule_path(3500, 8, 128, 3072, 768) == "tilings"
    assert launcher.moe_rule_path(0, 8, 128, 3072, 3072) == "tilings"
    assert launcher.moe_rule_path(3500, 8, 0, 3072, 3072) == "tilings"


def test_args_struct_matches_the_c_header(tmp_path):
    """launcher.MoEExpertsArgs lays out et_trt_moe_experts_args as the C compiler does, field by field."""
    import ctypes

    from et_trt_backend.kernels.launcher import MoEExpertsArgs

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    fields = [name for name, _ in MoEExpertsArgs._fields_]
    program = tmp_path / "layout.c"
    program.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "moe_experts_capi.h"\nint main(void) {\n'
                       + "".join(f'  printf("%zu\\n", offsetof(et_trt_moe_experts_args, {f}));\n' for f in fields)
                       + '  printf("%zu\\n", sizeof(et_trt_moe_experts_args));\n  return 0;\n}\n')
    subprocess.run([compiler, f"-I{REPO / 'runtime' / 'kernels'}", program, "-o", tmp_path / "layout"], check=True)
    layout = [int(x) for x in subprocess.run([tmp_path / "layout"], capture_output=True, text=True,
                                             check=True).stdout.split()]
    assert layout == [getattr(MoEExpertsArgs, f).offset for f in fields] + [ctypes.sizeof(MoEExpertsArgs)]


def test_launch_args_take_sizes_from_the_shapes_and_names_from_the_plugin_tables():
    """moe_op.launch_args (what the eager op, the GPU tests and the benchmarks launch with): pointers of the tensors
    given, None for those absent, sizes from the shapes, the activation and layout as the C side numbers them."""
    import torch

    from et_trt_backend.kernels.moe_op import launch_args
    from et_trt_backend.plugin_names import MOE_ACTIVATIONS, MOE_GATE_UP_LAYOUTS

    tokens, top_k, experts, size, ffn = 5, 2, 4, 32, 24
    hidden, out = torch.randn(tokens, size), torch.empty(tokens, size)
    ids, weights = torch.zeros(tokens, top_k, dtype=torch.int32), torch.rand(tokens, top_k, dtype=torch.bfloat16)
    w_gate_up, w_down, b_down = torch.randn(experts, 2 * ffn, size), torch.randn(experts, size, ffn), torch.randn(8)
    workspace = torch.empty(77, dtype=torch.uint8)
    args = launch_args(hidden, ids, weights, w_gate_up, w_down, out, workspace, experts=9, ffn=ffn, b_down=b_down,
                       activation="geglu_erf", gate_up_layout="blocked8", alpha=0.5, limit=3.0, group_size=64)
    assert (args.hidden, args.topk_ids, args.topk_weights, args.w_gate_up, args.w_down, args.out, args.workspace,
            args.b_down) == tuple(t.data_ptr() for t in (hidden, ids, weights, w_gate_up, w_down, out, workspace,
                                                         b_down))
    assert (args.b_gate_up, args.w_gate_up_scale, args.w_down_scale) == (None, None, None)
    assert (args.tokens, args.top_k, args.experts, args.hidden_size, args.ffn, args.workspace_bytes,
            args.group_size, args.weights_fp32) == (tokens, top_k, 9, size, ffn, 77, 64, 0)
    assert (args.activation, args.gate_up_layout) == (MOE_ACTIVATIONS["geglu_erf"],
                                                   MOE_GATE_UP_LAYOUTS.index("blocked8"))
    assert (args.alpha, args.limit) == (0.5, 3.0)
    assert launch_args(hidden, ids, weights.float(), w_gate_up, w_down, out, workspace, experts=4,
                       ffn=ffn).weights_fp32 == 1


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is installed here")
def test_launcher_without_a_driver_says_so(launcher_library, monkeypatch):
    from et_trt_backend.kernels import launcher

    monkeypatch.setenv(launcher.LIBRARY_ENV, str(launcher_library / "libet_trt_grouped_mm.so"))
    monkeypatch.setattr(launcher, "_lib", None)
    with pytest.raises(launcher.LauncherError, match="libcuda.so.1"):
        launcher.MoEExpertsLauncher(moe_aot.moe_experts_images(["sm_90a"], "bf16"))
    assert launcher.moe_workspace_bytes(0, 2, 8, 64, 32) > 0  # the offsets' region


def test_eager_op_fake_shapes_and_input_errors():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from et_trt_backend.kernels import moe_op  # noqa: F401 (registers torch.ops.et_trt.moe_experts)

    with FakeTensorMode():
        hidden = torch.empty(37, 64, dtype=torch.bfloat16)
        ids = torch.empty(37, 2, dtype=torch.int32)
        weights = torch.empty(37, 2)
        w_down = torch.empty(4, 64, 24, dtype=torch.bfloat16)
        out = torch.ops.et_trt.moe_experts(hidden, ids, weights, torch.empty(4, 48, 64, dtype=torch.bfloat16), w_down)
        assert out.shape == (37, 64) and out.dtype == torch.bfloat16
        out = torch.ops.et_trt.moe_experts(hidden, ids, weights, torch.empty(4, 24, 64, dtype=torch.bfloat16), w_down,
                                           activation="relu2")
        assert out.shape == (37, 64)
        with pytest.raises(ValueError, match="w_gate_up must be"):
            torch.ops.et_trt.moe_experts(hidden, ids, weights, torch.empty(4, 24, 64, dtype=torch.bfloat16), w_down)
        with pytest.raises(ValueError, match="topk_ids must be int32"):
            torch.ops.et_trt.moe_experts(hidden, ids.long(), weights, torch.empty(4, 48, 64, dtype=torch.bfloat16),
                                         w_down)
