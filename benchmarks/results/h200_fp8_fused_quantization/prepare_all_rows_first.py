"""The second call's images, with fused_quantization.patch applied: benchmarks/device/prepare.py's fp8 contenders
plus a candidate of the fused fp8 wgmma kernel whose prologue quantizes every row before any tile starts (no
overlap with the products). Run from the repository root, after benchmarks/device/prepare.py."""
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path.cwd()))
from benchmarks.device import prepare  # noqa: E402
from et_trt_backend.kernels import aot, sm90  # noqa: E402

FIRST_WAVE = "quantize_claimed_rows<4>(quantization, table, G, K, schedule.first_rows);"
EVERY_ROW = "quantize_claimed_rows<4>(quantization, table, G, K, 0x7fffffff);"

source = sm90.SOURCE.read_text()
assert FIRST_WAVE in source, "apply fused_quantization.patch first"
patched = pathlib.Path(tempfile.mkdtemp()) / sm90.SOURCE.name
patched.write_text(source.replace(FIRST_WAVE, EVERY_ROW))
shipped, sm90.SOURCE = sm90.SOURCE, patched
all_rows_first = sm90.image("bf16", weight_format="fp8")
sm90.SOURCE = shipped

triton = [i for i in aot.grouped_mm_images([prepare.ARCH], "bf16", True, weight_format="fp8") if i.variant != "wgmma"]
save_contenders = prepare.save_contenders
prepare.save_contenders = lambda name, contenders: save_contenders(
    name, {**contenders, "ours_fp8_try_all_rows_first": [all_rows_first] + triton})
prepare.save_fp8_bench_images()
