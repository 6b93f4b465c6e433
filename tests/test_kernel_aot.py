"""The grouped-GEMM kernel on the CPU machine: AOT images per architecture, their SASS,
the kernel's semantics in Triton's interpreter, the C++ launcher build, and the
eager op's fake implementation. The GPU side is tests/test_kernel_gpu.py."""

import collections
import ctypes.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from et_trt_backend import options
from et_trt_backend.kernels import aot, images, sm90
from et_trt_backend.serialization.kernel_image import KernelImage

triton = pytest.importorskip("triton", reason="AOT compilation needs Triton")

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def sass_ops(image: KernelImage, tmp_path) -> collections.Counter:
    path = tmp_path / f"{image.kernel}_{image.arch}.cubin"
    path.write_bytes(image.image.bytes())
    sass = subprocess.run([BIN / "cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    assert "grouped_mm_kernel" in sass
    return collections.Counter(m.split(".")[0] for m in re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]+)", sass, re.M))


def by_variant(images, fmt="cubin"):
    return {i.kernel.rsplit("_", 1)[0].removeprefix("grouped_mm_"): i for i in images if i.format == fmt}


@pytest.mark.parametrize("arch", options.DEFAULT_KERNEL_ARCHS)
def test_every_default_arch_compiles(arch):
    images = aot.grouped_mm_images([arch], "bf16", True)
    cubins = [i for i in images if i.format == "cubin"]
    cap = arch.removeprefix("sm_").rstrip("a")
    # sm_90a with weights [G, N, K]: the hand-written wgmma kernel first (tests/test_kernel_sm90.py).
    wgmma = ["grouped_mm_wgmma_nk"] if cap == "90" and sm90.nvcc_path() else []
    assert [i.kernel for i in cubins] == wgmma + [aot.kernel_name(c.variant, True) for c in aot.configs_for(arch)]
    for image in cubins:
        assert image.image.bytes()[:4] == b"\x7fELF"
        assert image.arch in (f"sm_{cap}", f"sm_{cap}a")
        assert image.entry == ("grouped_mm_wgmma" if image.kernel in wgmma else "grouped_mm_kernel")
        assert image.dtype == "bf16" and image.persistent
        assert 0 < image.shared_bytes <= (227 if cap in ("90", "100", "110") else 163 if cap in ("80", "87") else 99) * 1024
        if image.variant in ("tma", "tma_small"):
            assert image.global_scratch_bytes > 0 and image.global_scratch_align >= 64  # device-side TMA descriptors
    # The portable fallback: PTX for sm_80, which any newer GPU's driver can JIT.
    ptx = [i for i in images if i.format == "ptx"]
    assert ptx and all(i.arch == "sm_80" for i in ptx)


def test_ptx_is_pinned_to_a_version_current_drivers_accept():
    """CUDA 13.0's driver JITs PTX up to 9.0; Triton 3.9's default is 9.4 (FACTS.md)."""
    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_120"):
        for config in aot.configs_for(arch):
            image = aot.compile_image(arch, "fp16", False, config, fmt="ptx")
            text = image.image.bytes().decode()
            version = re.search(r"^\.version (\d+)\.(\d+)$", text, re.M)
            assert version and f"{version[1]}.{version[2]}" == image.ptx_version
            assert (int(version[1]), int(version[2])) <= (9, 0)
            assert re.search(r"^\.target sm_\d+a?$", text, re.M)


def test_sm90a_cubin_uses_tma_and_wgmma(tmp_path):
    images = by_variant(aot.grouped_mm_images(["sm_90a"], "bf16", True))
    for variant in ("tma", "tma_small"):
        ops = sass_ops(images[variant], tmp_path)
        assert ops["HGMMA"] > 0, f"{variant}: no wgmma (HGMMA) in the sm_90a SASS"
        assert ops["UTMALDG"] > 0, f"{variant}: no TMA loads (UTMALDG) in the sm_90a SASS"
        assert ops["LDL"] == ops["STL"] == 0, f"{variant}: registers spill to local memory"
    ops = sass_ops(images["tile"], tmp_path)
    assert ops["HGMMA"] > 0 and ops["LDGSTS"] > 0  # wgmma fed by cp.async


def test_sm80_cubin_uses_mma_sync_and_cp_async(tmp_path):
    for arch in ("sm_80", "sm_87"):
        ops = sass_ops(by_variant(aot.grouped_mm_images([arch], "fp16", False))["tile"], tmp_path)
        assert ops["HMMA"] > 0, f"{arch}: no mma.sync (HMMA)"
        assert ops["LDGSTS"] > 0, f"{arch}: no cp.async (LDGSTS)"
        assert ops["LDL"] == ops["STL"] == 0


def test_blackwell_cubins(tmp_path):
    ops = sass_ops(by_variant(aot.grouped_mm_images(["sm_100a"], "bf16", True))["tma"], tmp_path)
    assert ops["UTCHMMA"] > 0 and ops["UTMALDG"] > 0  # tcgen05 MMA fed by TMA
    ops = sass_ops(by_variant(aot.grouped_mm_images(["sm_120"], "bf16", True))["tma"], tmp_path)
    assert ops["HMMA"] > 0 and ops["UTMALDG"] > 0  # consumer Blackwell: mma.sync fed by TMA


# FP8 tensor cores in each architecture's SASS: QMMA (mma.sync e4m3, Ada and consumer Blackwell),
# QGMMA (wgmma e4m3, Hopper), UTCQMMA (tcgen05 e4m3, Blackwell and Thor).
_FP8_MMA = {"sm_89": "QMMA", "sm_90a": "QGMMA", "sm_100a": "UTCQMMA", "sm_110a": "UTCQMMA", "sm_120a": "QMMA"}


@pytest.mark.parametrize("arch", sorted(_FP8_MMA))
def test_fp8_images_use_fp8_tensor_cores(arch, tmp_path):
    fp8 = aot.grouped_mm_images([arch], "bf16", True, weight_format="fp8")
    gemms = [i for i in fp8 if not i.variant.startswith("quantize_rows")]
    assert [i.variant for i in gemms if i.variant != "wgmma"] == [c.variant for c in aot.configs_for(arch, "fp8")]
    assert sorted(i.variant for i in fp8 if i.variant.startswith("quantize_rows")) == sorted(aot.QUANTIZE_VARIANTS)
    for image in fp8:
        assert image.weight_format == "fp8" and image.dtype == "bf16" and image.trans_b
        assert image.format == "cubin" and image.arch == arch  # no PTX fallback: sm_80 has no FP8 MMA
        # GroupedMMLauncher starts a GEMM during the row quantization only where its image says it waits for it.
        assert image.waits_for_prior_grid == (image in gemms and arch != "sm_89"), image.variant
    for image in gemms:
        if image.variant == "wgmma":
            continue  # the hand-written kernel: tests/test_kernel_sm90.py
        ops = sass_ops(image, tmp_path)
        assert ops[_FP8_MMA[arch]] > 0, f"{image.variant}: no FP8 MMA ({_FP8_MMA[arch]}) in the {arch} SASS"
        assert ops["LDL"] == ops["STL"] == 0, f"{image.variant}: registers spill to local memory"
        # From sm_90 the GEMM starts during the row quantization and waits for it (griddepcontrol.wait: ACQBULK).
        assert (ops["ACQBULK"] > 0) == (arch != "sm_89"), f"{image.variant}: griddepcontrol.wait missing or misplaced"
    if arch == "sm_89":
        assert {i.ptx_version for i in fp8} == {"8.4"}  # sm_89's FP8 mma needs PTX ISA 8.4


def test_fp8_row_quantization_is_vectorized_where_k_allows(tmp_path):
    quantize = {i.variant: i for i in aot.quantize_rows_images("sm_90a", "fp16")}
    for variant, config in aot.QUANTIZE_VARIANTS.items():
        # The launcher reads a variant's rows per CTA, and the whole-row one's largest K, from the image.
        assert (quantize[variant].block_m, quantize[variant].block_k) == (config.block_m, config.block_k)
        assert not quantize[variant].persistent
        aligned = config.k_aligned
        path = tmp_path / f"{variant}.cubin"
        path.write_bytes(quantize[variant].image.bytes())
        sass = subprocess.run([BIN / "cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
        assert "quantize_rows_kernel" in sass and "F2FP" in sass  # float32 -> e4m3 pairs
        assert ("LDG.E.128" in sass) == aligned, f"{variant}: 16-byte loads only when K % 16 == 0"
        assert "PREEXIT" in sass, f"{variant}: does not let the GEMM launch early (griddepcontrol.launch_dependents)"
        # FCHK is the IEEE division's check for its slow path: once per row (the scale, its inverse), never per value.
        assert sass.count("FCHK") < 2 * sass.count("F2FP"), f"{variant}: divides per quantized value"


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_87"])
def test_fp8_refuses_architectures_without_fp8_tensor_cores(arch):
    with pytest.raises(ValueError, match=rf"{arch} has no FP8 tensor cores.*kernel_archs"):
        aot.grouped_mm_images(["sm_90a", arch], "bf16", True, weight_format="fp8")


def test_fp8_form_needs_weights_stored_n_by_k():
    with pytest.raises(ValueError, match=r"\[G, N, K\] only \(trans_b = True\)"):
        aot.grouped_mm_images(["sm_90a"], "bf16", False, weight_format="fp8")
    with pytest.raises(ValueError, match="'int3'"):
        aot.grouped_mm_images(["sm_90a"], "bf16", True, weight_format="int3")


def test_images_come_from_the_disk_cache(monkeypatch):
    first = aot.grouped_mm_images(["sm_90a"], "fp16", True)

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the cache holds the image")

    monkeypatch.setattr(triton, "compile", no_compile)
    assert aot.grouped_mm_images(["sm_90a"], "fp16", True) == first


def test_save_and_load_images_round_trip(tmp_path):
    compiled = aot.grouped_mm_images(["sm_90a"], "bf16", False)
    images.save_images(tmp_path / "images.json", compiled)
    assert images.load_images(tmp_path / "images.json") == compiled


def test_bad_arch_and_dtype_are_named():
    with pytest.raises(ValueError, match="sm_75"):
        aot.grouped_mm_images(["sm_75"], "bf16", True)
    with pytest.raises(ValueError, match="fp32"):
        aot.grouped_mm_images(["sm_90a"], "fp32", True)


# Runs the kernel source in Triton's CPU interpreter (the compiled path needs a GPU):
# the group walk, offset clamping, tail zeroing and both load paths against float32.
_INTERPRETER_CHECK = textwrap.dedent("""
    import torch, triton
    from et_trt_backend.kernels.grouped_mm import grouped_mm_kernel

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    torch.manual_seed(0)

    def reference(a, b, offs, trans_b):
        out = torch.zeros(a.shape[0], b.shape[1] if trans_b else b.shape[2])
        start = 0
        for g, raw in enumerate(offs.tolist()):
            end = min(max(raw, start), a.shape[0])
            out[start:end] = a[start:end].float() @ (b[g].float().T if trans_b else b[g].float())
            start = end
        return out

    cases = [(70, 40, 56, [10, 10, 60, 65, 65, 65, 66]),           # empty groups, tail rows
             (50, 16, 24, [-5, 200, 3, 2**31 - 1, 9, 9]),          # invalid offsets
             (40, 24, 8, [0] * 9 + [40])]                          # one group, chunks of 4
    for rows, k, n, offs in cases:
        for trans_b in (False, True):
            for use_tma in (False, True):
                g = len(offs)
                a = torch.randn(rows, k).half()
                b = torch.randn((g, n, k) if trans_b else (g, k, n)).half()
                offs_t = torch.tensor(offs, dtype=torch.int32)
                out = torch.full((rows, n), float("nan")).half()
                grouped_mm_kernel[(3,)](a, b, offs_t, out, rows, k, n, g, None, None, FP8=False, WAIT_PRIOR_GRID=False,
                                        TRANS_B=trans_b, USE_TMA=use_tma, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                        GROUP_CHUNK=4)
                ref = reference(a, b, offs_t, trans_b)
                assert not out.isnan().any(), (rows, offs, trans_b, use_tma, "unwritten outputs")
                err = float((out.float() - ref).norm() / ref.norm())
                assert err < 1e-2, (rows, offs, trans_b, use_tma, err)

    # The FP8 form: operands quantized as et_trt_backend/quantization.py does, scales applied in the
    # epilogue; against the float32 products of the same quantized operands. (The interpreter's own
    # float32 -> e4m3 conversion rounds some values wrongly, so the operands are quantized by torch.)
    def quantized(x, dim):
        amax = x.abs().amax(dim, keepdim=True)
        scale = torch.where(amax > 0, amax / 448, torch.ones(()))
        return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.squeeze(dim)

    for rows, k, n, offs in cases:
        for use_tma in (False, True):
            k = k if not use_tma else (k + 15) // 16 * 16  # TMA needs 16-byte rows
            g = len(offs)
            a = torch.randn(rows, k)
            a[1] = 0  # an all-zero row has scale 1
            a_q, a_scale = quantized(a, 1)
            b_q, b_scale = quantized(torch.randn(g, n, k), 2)
            offs_t = torch.tensor(offs, dtype=torch.int32)
            out = torch.full((rows, n), float("nan")).bfloat16()
            grouped_mm_kernel[(3,)](a_q, b_q, offs_t, out, rows, k, n, g, a_scale, b_scale, FP8=True,
                                    WAIT_PRIOR_GRID=False, TRANS_B=True, USE_TMA=use_tma, BLOCK_M=16, BLOCK_N=16,
                                    BLOCK_K=32, GROUP_CHUNK=4)
            ref = reference(a_q.float() * a_scale[:, None], b_q.float() * b_scale[:, :, None], offs_t, True)
            assert not out.isnan().any(), (rows, offs, use_tma, "unwritten outputs (fp8)")
            err = float((out.float() - ref).norm() / ref.norm())
            assert err < 1e-2, (rows, offs, use_tma, err, "fp8")
    print("interpreter ok")
""")


def test_kernel_semantics_in_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", _INTERPRETER_CHECK], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and "interpreter ok" in result.stdout, result.stderr[-3000:]


def test_launcher_builds_without_libcuda(launcher_library):
    assert (launcher_library / "libet_trt_kernels.a").exists()
    shared = launcher_library / "libet_trt_grouped_mm.so"
    needed = subprocess.run(["readelf", "-d", shared], capture_output=True, text=True, check=True).stdout
    assert "libcuda" not in needed  # loaded with dlopen at run time
    exported = subprocess.run(["nm", "-D", "--defined-only", shared], capture_output=True, text=True, check=True).stdout
    for symbol in ("et_trt_grouped_mm_create", "et_trt_grouped_mm_launch", "et_trt_grouped_mm_destroy"):
        assert symbol in exported


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is installed here")
def test_launcher_without_a_driver_says_so(launcher_library, monkeypatch):
    from et_trt_backend.kernels import launcher

    monkeypatch.setenv(launcher.LIBRARY_ENV, str(launcher_library / "libet_trt_grouped_mm.so"))
    monkeypatch.setattr(launcher, "_lib", None)
    with pytest.raises(launcher.LauncherError, match="libcuda.so.1"):
        launcher.GroupedMMLauncher(aot.grouped_mm_images(["sm_90a"], "bf16", True))


def test_the_launcher_binding_needs_neither_executorch_nor_triton(tmp_path):
    """The device checks and benchmarks run the launcher where only torch is installed."""
    images.save_images(tmp_path / "images.json", aot.grouped_mm_images(["sm_90a"], "bf16", True))
    code = f"""
import sys
sys.modules["executorch"] = sys.modules["triton"] = None  # importing either now fails
from et_trt_backend.kernels import launcher
from et_trt_backend.kernels.images import load_images
from et_trt_backend.serialization import blob
print(len(blob.kernel_images_flatbuffer(load_images({str(tmp_path / "images.json")!r}))) > 0)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-3000:]


def test_launcher_abi_refuses_what_is_not_the_schemas_kernel_images(launcher_library):
    """The C ABI reads the images' fields through the blob schema: anything else is refused before the
    driver is needed, naming what is wrong."""
    from et_trt_backend.serialization import blob

    lib = ctypes.CDLL(str(launcher_library / "libet_trt_grouped_mm.so"))
    lib.et_trt_grouped_mm_create.restype = ctypes.c_void_p
    images = aot.grouped_mm_images(["sm_90a"], "bf16", True)
    kernels = blob.kernel_images_flatbuffer(images)
    data = [i.image.bytes() for i in images]

    def create(buffer: bytes, data: list[bytes], sizes: list[int]) -> str:
        error = ctypes.create_string_buffer(1024)
        handle = lib.et_trt_grouped_mm_create(
            buffer, ctypes.c_size_t(len(buffer)), (ctypes.c_char_p * len(data))(*data),
            (ctypes.c_size_t * len(sizes))(*sizes), ctypes.c_int32(len(data)), error, ctypes.c_size_t(len(error)))
        assert not handle
        return error.value.decode()

    assert "not a flatbuffer of the blob schema" in create(kernels[:-8], data, [len(d) for d in data])
    assert "not a flatbuffer of the blob schema" in create(b"ETRT" * 16, data, [len(d) for d in data])
    assert f"{len(data) - 1} image byte strings for {len(data)} kernel images" in create(
        kernels, data[:-1], [len(d) for d in data[:-1]])
    wrong = [len(d) for d in data]
    wrong[1] -= 1
    assert f"({images[1].kernel}) has {wrong[1]} bytes; its record says {len(data[1])}" in create(kernels, data, wrong)


def test_launcher_keeps_its_flatbuffers_apart_from_executorchs(launcher_library, tmp_path):
    """A process that loaded ExecuTorch's XNNPACK backend (flatbuffers 24, symbols exported) first still
    gets the launcher's own flatbuffers code: the images are read, and only the missing driver stops it."""
    import executorch

    xnnpack = pathlib.Path(list(executorch.__path__)[0]) / "lib" / "libexecutorch_backend_xnnpack.so"
    if not xnnpack.exists():
        pytest.skip(f"{xnnpack} is not in this ExecuTorch wheel")
    if ctypes.util.find_library("cuda") is not None:
        pytest.skip("a CUDA driver is installed here: the launcher would get past the driver")
    images.save_images(tmp_path / "images.json", aot.grouped_mm_images(["sm_90a"], "bf16", True))
    code = f"""
import ctypes
ctypes.CDLL({str(xnnpack)!r}, mode=ctypes.RTLD_GLOBAL)
from et_trt_backend.kernels import launcher
from et_trt_backend.kernels.images import load_images
try:
    launcher.GroupedMMLauncher(load_images({str(tmp_path / "images.json")!r}))
except launcher.LauncherError as e:
    print(e)
"""
    env = dict(os.environ, **{"ET_TRT_GROUPED_MM_LIB": str(launcher_library / "libet_trt_grouped_mm.so")})
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert "libcuda.so.1" in result.stdout, result.stdout + result.stderr[-3000:]


def test_eager_op_fake_shapes_and_input_errors():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from et_trt_backend.kernels import op  # noqa: F401 (registers torch.ops.et_trt.grouped_mm)

    with FakeTensorMode():
        a = torch.empty(37, 64, dtype=torch.bfloat16)
        offs = torch.empty(4, dtype=torch.int32)
        out = torch.ops.et_trt.grouped_mm(a, torch.empty(4, 96, 64, dtype=torch.bfloat16), offs, True)
        assert out.shape == (37, 96) and out.dtype == torch.bfloat16
        out = torch.ops.et_trt.grouped_mm(a, torch.empty(4, 64, 80, dtype=torch.bfloat16), offs, False)
        assert out.shape == (37, 80)
        with pytest.raises(ValueError, match="K of a"):
            torch.ops.et_trt.grouped_mm(a, torch.empty(4, 96, 65, dtype=torch.bfloat16), offs, True)
        with pytest.raises(ValueError, match="bfloat16 or float16"):
            torch.ops.et_trt.grouped_mm(a.float(), torch.empty(4, 96, 64), offs, True)
