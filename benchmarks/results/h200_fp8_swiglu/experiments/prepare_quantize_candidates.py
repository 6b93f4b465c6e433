"""The CUDA row quantizations of cuda_quantize_fp8_grouped_mm_bench.md (quantize_rows_cuda.cu, one warp per row, the
row in registers or read twice), each in the launcher's "quantize_rows" slot beside the shipped fp8 images, as
fp8 bench candidates. Run from the repository root after benchmarks/device/prepare.py; on the H200
BENCH_ONLY=1 BENCHES=fp8 FP8_ARGS=--skip-robot bash benchmarks/device/run_all.sh, then check_quantize.py
(carry .device, copy check_quantize.py there)."""
import logging
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path.cwd()))
from benchmarks.device import prepare  # noqa: E402
from et_trt_backend.serialization.kernel_image import KernelImage  # noqa: E402
from et_trt_backend.serialization.named_data import NamedData  # noqa: E402

SRC = pathlib.Path(__file__).with_name("quantize_rows_cuda.cu")
VARIANTS = {  # label: (rows per CTA, vectors per lane, extra defines)
    "r8_l12": (8, 12, []),
    "r4_l12": (4, 12, []),
    "r16_l12": (16, 12, []),
    "r8_l12_ldcs": (8, 12, ["-DLOAD=__ldcs"]),
    "r8_two_reads": (8, 12, ["-DTWO_READS"]),
}


def cuda_image(label):
    rows, per_lane, extra = VARIANTS[label]
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "q.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-DELEM=__nv_bfloat16",
                        f"-DROWS_PER_CTA={rows}", f"-DPER_LANE={per_lane}", *extra, str(SRC), "-o", str(out)],
                       check=True)
        data = out.read_bytes()
    return KernelImage(kernel=f"quantize_rows_cuda_{label}", variant="quantize_rows", trans_b=True, arch="sm_90a",
                       format="cubin", image=NamedData.of(data), entry="quantize_rows_cuda", dtype="bf16",
                       num_warps=rows, shared_bytes=0, global_scratch_bytes=0, global_scratch_align=1,
                       profile_scratch_bytes=0, block_m=rows, block_n=1, block_k=32 * per_lane * 8,
                       persistent=False, ptx_version="", weight_format="fp8")


logging.basicConfig(level=logging.INFO)
save = prepare.save_contenders


def with_candidates(name, contenders):
    fp8 = contenders["ours_fp8"]
    extra = {}
    for label in VARIANTS:
        swapped = [cuda_image(label) if i.variant == "quantize_rows" else i for i in fp8]
        extra[f"ours_fp8_try_{label}"] = swapped
    keep = {k: v for k, v in contenders.items() if k in ("ours_bf16", "ours_fp8", "ours_fp8_try_repeat")}
    return save(name, {**keep, **extra})


prepare.save_contenders = with_candidates
prepare.save_fp8_bench_images()
