"""The candidates of candidates_fp8_swiglu_bench.md: the SwiGLU row quantization with PyTorch's IEEE sigmoid
("exact", as first written) or Triton's ("fast", as shipped), in two reads of blocks of 2 or 4 rows or one read
of whole rows, each in the launcher's "quantize_rows_swiglu" slot beside the shipped fp8 images
(groups ours_fp8_try_*). Run from the repository root after benchmarks/device/prepare.py; then on the H200
BENCH_ONLY=1 BENCHES=swiglu SWIGLU_ARGS=--skip-robot bash benchmarks/device/run_all.sh."""
import dataclasses
import importlib.util
import logging
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path.cwd()))
from benchmarks.device import prepare  # noqa: E402
from et_trt_backend.kernels import aot, quantize_rows  # noqa: E402

FAST = "        silu = (gate * tl.sigmoid(gate)).to(x.dtype)"
EXACT = ("        sigmoid = tl.math.div_rn(tl.full(gate.shape, 1.0, tl.float32), 1.0 + libdevice.exp(-gate))\n"
         "        silu = (gate * sigmoid).to(x.dtype)")


def _exact_module():
    source = pathlib.Path(quantize_rows.__file__).read_text()
    assert FAST in source, "the shipped kernel's sigmoid line moved"
    path = pathlib.Path(tempfile.mkdtemp()) / "quantize_rows_exact.py"
    path.write_text(source.replace(FAST, EXACT))
    spec = importlib.util.spec_from_file_location("quantize_rows_exact", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


logging.basicConfig(level=logging.INFO)
exact = _exact_module()
base = aot.QUANTIZE_VARIANTS["quantize_rows"]  # two reads of blocks of 4 rows
whole = aot.QUANTIZE_VARIANTS["quantize_rows_whole"]
CANDIDATES = {  # label: (kernel module, config)
    "exact_m2": (exact, dataclasses.replace(base, block_m=2, swiglu=True)),
    "exact_whole": (exact, dataclasses.replace(whole, swiglu=True)),
    "fast_m4": (quantize_rows, dataclasses.replace(base, swiglu=True)),
    "fast_m2": (quantize_rows, dataclasses.replace(base, block_m=2, swiglu=True)),
    "fast_whole": (quantize_rows, dataclasses.replace(whole, swiglu=True)),
}


def compile_candidate(module, config):
    signature = {"a_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "rows": "i32", "K": "i32",
                 "BLOCK_M": "constexpr", "BLOCK_K": "constexpr", "LAUNCH_DEPENDENTS": "constexpr",
                 "WHOLE_ROWS": "constexpr", "SWIGLU": "constexpr"}
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_K": config.block_k, "LAUNCH_DEPENDENTS": True,
                  "WHOLE_ROWS": config.whole_rows, "SWIGLU": True}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    compiled = aot._triton_compile(module.quantize_rows_kernel, signature, constexprs, attrs, 90, config.num_warps,
                                   1, aot._PTX_VERSION[90])
    return aot._image(compiled, kernel="quantize_rows_swiglu", variant="quantize_rows_swiglu", trans_b=True, cap=90,
                      fmt="cubin", dtype="bf16", block_m=config.block_m, block_n=1, block_k=config.block_k,
                      persistent=False, ptx_version=aot._PTX_VERSION[90], weight_format="fp8")


save = prepare.save_contenders


def with_candidates(name, contenders):
    # The candidate serves every launch of the MoE shapes: the whole-row slot is left out.
    fp8 = [i for i in contenders["ours_fp8"] if i.variant != "quantize_rows_swiglu_whole"]
    extra = {f"ours_fp8_try_{label}": [compile_candidate(m, c) if i.variant == "quantize_rows_swiglu" else i
                                       for i in fp8] for label, (m, c) in CANDIDATES.items()}
    keep = {k: v for k, v in contenders.items() if k in ("ours_bf16", "ours_fp8", "ours_fp8_try_repeat")}
    return save(name, {**keep, **extra})


prepare.save_contenders = with_candidates
prepare.save_fp8_bench_images()
