"""The second call's images (fused_quantization.patch applied): .device/fp8_bench_images.json with a candidate of
the fused fp8 wgmma kernel whose prologue quantizes every row before any tile starts (no overlap with the products).
Run from the repository root, after benchmarks/device/prepare.py."""
import pathlib, sys, tempfile
sys.path.insert(0, str(pathlib.Path.cwd()))
sys.argv = ["prepare"]
from benchmarks.device import prepare
from et_trt_backend.kernels import aot, sm90

src = sm90.SOURCE.read_text()
old = "quantize_claimed_rows<4>(quantization, table, G, K, schedule.first_rows);"
assert old in src
patched = pathlib.Path(tempfile.mkdtemp()) / "grouped_mm_sm90.cu"
patched.write_text(src.replace(old, "quantize_claimed_rows<4>(quantization, table, G, K, 0x7fffffff);"))
fp8 = aot.grouped_mm_images([prepare.ARCH], "bf16", True, weight_format="fp8")
quantize = [i for i in fp8 if i.variant.startswith("quantize_rows")]
shipped = [i for i in fp8 if i.variant == "wgmma"]
sm90.SOURCE = patched
all_first = sm90.image("bf16", weight_format="fp8")
sm90.SOURCE = pathlib.Path("et_trt_backend/kernels/grouped_mm_sm90.cu").resolve()
assert all_first.image.bytes() != shipped[0].image.bytes()
contenders = {
    "ours_bf16": [i for i in aot.grouped_mm_images([prepare.ARCH], "bf16", True) if i.format == "cubin"],
    "ours_fp8": fp8,
    "ours_fp8_wgmma": shipped + quantize,
    "ours_fp8_triton": [i for i in fp8 if i.variant != "wgmma"],
    "ours_fp8_try_repeat": fp8,
    "ours_fp8_try_all_rows_first": [all_first] + [i for i in fp8 if i.variant != "wgmma"],
}
prepare.save_contenders("fp8_bench_images", contenders)
print("ok")
