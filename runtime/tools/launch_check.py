"""Device check of the GroupedMM plugin's launch path, without TensorRT.

Each blob (written by our export; runtime/tools/extract_blobs.py takes them out
of a .pte, with their named data in <blob>.named/) is read and verified by the
C++ blob reader with its named data, its kernel images go
through the same pack/unpack as the plugin's fields, and are launched through
the kernel launcher (libet_trt_launch_check.so, built by scripts/build_runtime.sh).
Outputs are compared with a float32 reference of contract 4's semantics (rows
outside every group are zero) and, where it applies, with torch._grouped_mm.
FP8 experts' images (weight format fp8) are launched with weights quantized as
the export does, against the reference of the same quantized operands
(et_trt_backend/quantization.py) and torch._scaled_grouped_mm.
Needs torch with CUDA; no Triton, no TensorRT, no ExecuTorch.

    python runtime/tools/launch_check.py BLOB... [--lib runtime/build/libet_trt_launch_check.so]

Exit status 0 only if every blob had kernel images and every case matched.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # et_trt_backend.quantization: the FP8 reference (torch only)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}  # relative to the output's scale; fp32 accumulation
SHAPES = [(64, 64), (128, 256), (96, 200), (70, 33)]  # (K, N): tma/tile-eligible and odd ("any")
ROWS = [0, 1, 37, 513]
GROUPS = [1, 3, 8]


def _library(path: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.et_trt_launch_check_create.restype = ctypes.c_void_p
    lib.et_trt_launch_check_create.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
        ctypes.c_char_p, ctypes.c_size_t]
    lib.et_trt_launch_check_launch.restype = ctypes.c_int32
    lib.et_trt_launch_check_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [
        ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p,
        ctypes.c_size_t]
    lib.et_trt_launch_check_fp8_workspace_bytes.restype = ctypes.c_size_t
    lib.et_trt_launch_check_fp8_workspace_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.et_trt_launch_check_last_kernel.restype = ctypes.c_char_p
    lib.et_trt_launch_check_last_kernel.argtypes = [ctypes.c_void_p]
    lib.et_trt_launch_check_destroy.argtypes = [ctypes.c_void_p]
    return lib


def _offsets(rows: int, groups: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "valid":  # cumulative ends, the last one at rows
        cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,), generator=gen)).values
        return torch.cat([cuts, torch.tensor([rows])]).to(torch.int32)
    if kind == "short":  # groups end before rows: the tail must be zero
        return (torch.arange(1, groups + 1) * (rows // (2 * groups))).to(torch.int32)
    if kind == "decreasing":
        return torch.tensor([rows - i * max(rows // groups, 1) for i in range(groups)], dtype=torch.int32)
    return torch.tensor([rows + 5 + 3 * i if i % 2 else -7 for i in range(groups)], dtype=torch.int32)  # out of range


def _reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, trans_b: bool) -> torch.Tensor:
    """Contract 4 in float32: end_g = clamp(offs[g], start_g, rows); uncovered rows are zero."""
    rows = a.shape[0]
    out = torch.zeros(rows, b.shape[1] if trans_b else b.shape[2], dtype=torch.float32, device=a.device)
    start = 0
    for g, off in enumerate(offs.tolist()):
        end = min(max(off, start), rows)
        w = b[g].float().t() if trans_b else b[g].float()
        out[start:end] = a[start:end].float() @ w
        start = end
    return out


def _named_data(blob_path: pathlib.Path) -> tuple:
    """The blob's named data that extract_blobs.py wrote under <blob>.named/ (file path = key), as the
    C entry takes it: keys, bytes, sizes, count."""
    folder = blob_path.with_suffix(".named")
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    keys = [str(path.relative_to(folder)).encode() for path in files]
    data = [path.read_bytes() for path in files]
    return ((ctypes.c_char_p * len(files))(*keys), (ctypes.c_char_p * len(files))(*data),
            (ctypes.c_size_t * len(files))(*map(len, data)), len(files))


# (dtype, trans_b, fp8 weights): FP8 experts' images take weights [G, N, K] only.
COMBOS = [(d, t, False) for d in DTYPES for t in (False, True)] + [(d, True, True) for d in DTYPES]


def _torch_result(a, b, offs, trans_b, fp8):
    """torch._grouped_mm (or, for fp8 weights (b_q, b_scale), torch._scaled_grouped_mm with row-wise scales);
    None where torch does not take the case."""
    try:
        if fp8:
            from et_trt_backend.quantization import quantize_rows_fp8

            b_q, b_scale = b
            a_q, a_scale = quantize_rows_fp8(a)
            return torch._scaled_grouped_mm(a_q, b_q.transpose(-2, -1), a_scale, b_scale, offs=offs,
                                            out_dtype=a.dtype)
        return torch._grouped_mm(a, b.transpose(-2, -1) if trans_b else b, offs=offs)
    except (RuntimeError, ValueError, NotImplementedError, AttributeError):
        return None  # shapes or dtypes torch's kernels do not take (alignment, fp16 out)


def _run_case(lib, handle, combo, k, n, groups, rows, kind, gen, failures):
    """One launch into a NaN-poisoned output, compared with the float32 (fp8: float64, of the same quantized
    operands) reference and, for valid offsets, with torch's kernel."""
    from et_trt_backend.quantization import (
        grouped_mm_fp8_reference,
        quantize_weights_fp8,
    )

    dtype, trans_b, fp8 = DTYPES[combo["dtype"]], combo["trans_b"], combo["fp8"]
    error = ctypes.create_string_buffer(4096)
    a = torch.randn(rows, k, generator=gen).to(dtype).cuda()
    b_shape = (groups, n, k) if trans_b else (groups, k, n)
    b = (torch.randn(*b_shape, generator=gen) / k**0.5).to(dtype).cuda()
    offs = _offsets(rows, groups, kind, gen).cuda()
    out = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
    b_scale = workspace = None
    if fp8:
        b, b_scale = quantize_weights_fp8(b)
        workspace = torch.full((lib.et_trt_launch_check_fp8_workspace_bytes(rows, k),), 0xFF, dtype=torch.uint8,
                               device="cuda")
    rc = lib.et_trt_launch_check_launch(
        handle, a.data_ptr(), b.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, int(trans_b),
        b_scale.data_ptr() if fp8 else None, workspace.data_ptr() if fp8 else None, workspace.numel() if fp8 else 0,
        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), error, 4096)
    where = (f"{combo['dtype']}{' fp8' if fp8 else ''} trans_b={trans_b} K={k} N={n} G={groups} rows={rows} "
             f"offs={kind}")
    if rc != 0:
        failures.append(f"{where}: launch failed: {error.value.decode()}")
        return
    torch.cuda.synchronize()
    combo["kernels"].add(lib.et_trt_launch_check_last_kernel(handle).decode())
    want = grouped_mm_fp8_reference(a, b, b_scale, offs) if fp8 else _reference(a, b, offs.cpu(), trans_b)
    scale = max(want.abs().max().item() if want.numel() else 0.0, 1.0)
    err = (out.float() - want).abs().max().item() / scale if out.numel() else 0.0
    combo["cases"] += 1
    combo["max_rel_err"] = max(combo["max_rel_err"], err)
    if not err <= TOLERANCE[combo["dtype"]]:  # also catches NaN left in the output
        failures.append(f"{where}: max error {err:.3g} of scale {scale:.3g}")
    if kind == "valid" and rows > 0:
        ref = _torch_result(a, (b, b_scale) if fp8 else b, offs, trans_b, fp8)
        if ref is not None:
            torch_err = (out.float() - ref.float()).abs().max().item() / scale
            combo["torch_compared"] += 1
            if not torch_err <= TOLERANCE[combo["dtype"]]:
                failures.append(f"{where}: vs torch {torch_err:.3g}")


def check_blob(lib: ctypes.CDLL, blob_path: pathlib.Path) -> dict:
    blob, name, named = blob_path.read_bytes(), str(blob_path), _named_data(blob_path)
    error = ctypes.create_string_buffer(4096)
    result = {"blob": name, "combos": [], "failures": []}
    gen = torch.Generator().manual_seed(0)
    for dtype_name, trans_b, fp8 in COMBOS:
        handle = lib.et_trt_launch_check_create(blob, len(blob), *named, dtype_name.encode(), int(trans_b), int(fp8),
                                                error, 4096)
        if not handle:
            message = error.value.decode()
            if "has no" in message and "kernel images" in message:
                continue  # the blob has no images for this dtype, layout and weight format
            result["failures"].append(f"{dtype_name} trans_b={trans_b} fp8={fp8}: create failed: {message}")
            continue
        combo = {"dtype": dtype_name, "trans_b": trans_b, "fp8": fp8, "cases": 0, "kernels": set(),
                 "max_rel_err": 0.0, "torch_compared": 0}
        try:
            for k, n in SHAPES:
                for groups in GROUPS:
                    for rows in ROWS:
                        for kind in ("valid", "short", "decreasing", "out_of_range"):
                            _run_case(lib, handle, combo, k, n, groups, rows, kind, gen, result["failures"])
        finally:
            lib.et_trt_launch_check_destroy(handle)
        combo["kernels"] = sorted(combo["kernels"])
        result["combos"].append(combo)
    if not result["combos"] and not result["failures"]:
        result["failures"].append("the blob carries no grouped-GEMM kernel image")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("blobs", nargs="+", type=pathlib.Path)
    parser.add_argument("--lib", type=pathlib.Path, default=REPO / "runtime" / "build" / "libet_trt_launch_check.so")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("launch_check: needs an NVIDIA GPU and torch with CUDA", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")  # makes the primary context current for the launcher
    print(f"GPU: {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}")
    lib = _library(args.lib)
    results = [check_blob(lib, path) for path in args.blobs]
    for r in results:
        for c in r["combos"]:
            torch_op = "torch._scaled_grouped_mm" if c["fp8"] else "torch._grouped_mm"
            print(f"{r['blob']}: {c['dtype']}{' fp8' if c['fp8'] else ''} trans_b={c['trans_b']}: {c['cases']} cases, "
                  f"kernels {c['kernels']}, max rel error {c['max_rel_err']:.3g}, {c['torch_compared']} also vs "
                  f"{torch_op}")
        for f in r["failures"]:
            print(f"{r['blob']}: FAIL {f}")
    if os.environ.get("OUT"):
        (pathlib.Path(os.environ["OUT"]) / "launch_check.json").write_text(json.dumps(results, indent=1))
    failed = sum(len(r["failures"]) for r in results)
    print("launch_check:", "PASS" if failed == 0 else f"FAIL ({failed} failures)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
