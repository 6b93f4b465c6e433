"""Device check of the MoEExperts plugin's runtime path, without TensorRT.

Each MoEExperts node of each blob (written by our export; benchmarks/device/prepare_plugin_run.py takes them out of
a .pte with their named data and writes nodes.json: each node's attributes and its weights' named data) is run
through libet_trt_moe_plugin_check.so, which drives the C++ plugin through its IPluginV3 interfaces as TensorRT
does (created from the node's attributes, serialized, created again from its fields, attached, shapes, workspace,
enqueue), with the model's own expert weights and random tokens, ids (some out of range) and routing weights.
Each output (poisoned with NaN before the run) is compared with et_trt_backend.moe_experts.reference in float32
(nodes with INT4 weights, group_size > 0: int4_weights.moe_experts_reference, the same math with q * scale; nodes
with FP8 weights, e4m3 with float32 scales: norm-wise, moe_experts_fp8.reference, which quantizes the GEMMs' inputs
as the kernels do; also reported, not checked: the norm-wise error against moe_experts.reference in float32 with the
same dequantized weights, issue 32's measure), and the plugin's enqueue is timed (CUDA events, 200 calls after 20). Needs torch with CUDA; no TensorRT,
no Triton, no ExecuTorch.

    python runtime/tools/moe_plugin_check.py NODES.json [--lib PATH]

Prints one table row per node, top-k and token count; exit status 0 only if every case ran and matched.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "runtime" / "tools"))
from et_trt_backend import int4_weights, moe_experts, moe_experts_fp8  # noqa: E402  (torch only)
from et_trt_backend.plugin_names import MOE_ACTIVATIONS  # noqa: E402
from launch_check import _named_data  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# int8: packed INT4 weights; fp8: e4m3 weights, f32: their scales
WEIGHT_DTYPES = {**DTYPES, "int8": torch.int8, "fp8": torch.float8_e4m3fn, "f32": torch.float32}
TRT_TYPES = {torch.float32: 0, torch.float16: 1, torch.int8: 2, torch.int32: 3, torch.float8_e4m3fn: 6,
             torch.bfloat16: 7}  # nvinfer1::DataType
TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}  # of the output's largest magnitude; float32 accumulation on both sides
# FP8 weights, norm-wise against moe_experts_fp8.reference (tests/test_moe_experts_fp8_gpu.py's bound): the kernels
# quantize as the reference does (IEEE quotients), but their FP8 MMA sums in another order: a gate+up output one
# bf16 ulp off may move its 1 x 128 block's scale, and that row then differs by about e4m3's rounding (moe_fp8.py).
FP8_TOLERANCE = 2e-2
TOKENS = (1, 16, 512)
TOP_K = (1, 2)


def _library(path: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.et_trt_moe_plugin_check_create.restype = ctypes.c_void_p
    lib.et_trt_moe_plugin_check_create.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_int32, ctypes.c_char_p, ctypes.c_float,
        ctypes.c_float, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
    shape = [ctypes.c_void_p] + [ctypes.c_int64] * 6 + [ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]
    lib.et_trt_moe_plugin_check_workspace_bytes.restype = ctypes.c_size_t
    lib.et_trt_moe_plugin_check_workspace_bytes.argtypes = shape
    lib.et_trt_moe_plugin_check_enqueue.restype = ctypes.c_int32
    lib.et_trt_moe_plugin_check_enqueue.argtypes = shape + [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
        ctypes.c_size_t]
    lib.et_trt_moe_plugin_check_destroy.argtypes = [ctypes.c_void_p]
    return lib


def _weights(blob_path: pathlib.Path, node: dict) -> list[torch.Tensor | None]:
    """The node's weight inputs (w_gate_up, w_down, b_gate_up, b_down, and for INT4 weights w_gate_up_scale and
    w_down_scale; None where absent), on the GPU."""
    folder = blob_path.with_suffix(".named")
    out = []
    for weight in node["weights"]:
        if weight is None:
            out.append(None)
            continue
        data = bytearray((folder / weight["key"]).read_bytes())
        values = torch.frombuffer(data, dtype=torch.uint8).view(WEIGHT_DTYPES[weight["dtype"]])
        out.append(values.view(weight["shape"]).cuda())
    return out


def _routing(tokens: int, top_k: int, experts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int32, distinct per token, the first token's last id out of range (it must add nothing);
    routing weights [T, k] float32."""
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    ids[0, -1] = experts if top_k > 1 else ids[0, -1]
    weights = torch.rand(tokens, top_k, generator=gen).softmax(-1)
    return ids.cuda(), weights.cuda()


def run_case(lib, handle, dtype_name: str, node: dict, weights: list, tokens: int, top_k: int) -> dict:
    dtype = DTYPES[dtype_name]
    group_size = node.get("group_size", 0)
    w_gate_up, w_down, b_gate_up, b_down, *scales = weights
    fp8 = w_gate_up.dtype == torch.float8_e4m3fn
    experts, n1 = w_gate_up.shape[:2]
    hidden_size = w_down.shape[1]
    gated = moe_experts.is_gated(node["activation_name"])
    ffn = (n1 // 2 if gated else n1) if group_size else w_down.shape[2]  # INT4: w_down's rows are packed
    gen = torch.Generator().manual_seed(tokens * 10 + top_k)
    hidden = torch.randn(tokens, hidden_size, generator=gen).to(dtype).cuda()
    ids, routing = _routing(tokens, top_k, experts, gen)
    inputs = [hidden, ids, routing, w_gate_up, w_down] + [b for b in (b_gate_up, b_down, *scales) if b is not None]
    types = (ctypes.c_int32 * len(inputs))(*(TRT_TYPES[t.dtype] for t in inputs))
    dims = (tokens, top_k, experts, hidden_size, n1, ffn)
    workspace = torch.empty(lib.et_trt_moe_plugin_check_workspace_bytes(handle, *dims, types, len(inputs)),
                            dtype=torch.uint8, device="cuda")
    out = torch.full((tokens, hidden_size), float("nan"), dtype=dtype, device="cuda")
    pointers = (ctypes.c_void_p * len(inputs))(*(t.data_ptr() for t in inputs))
    error = ctypes.create_string_buffer(4096)
    stream = torch.cuda.current_stream().cuda_stream

    def enqueue() -> int:
        return lib.et_trt_moe_plugin_check_enqueue(handle, *dims, types, len(inputs), pointers, out.data_ptr(),
                                                   workspace.data_ptr(), stream, error, len(error))

    if enqueue() != 0:
        return {"error": error.value.decode(errors="replace")}
    torch.cuda.synchronize()
    options = dict(activation=node["activation_name"], gate_up_layout=node["gate_up_layout"], alpha=node["alpha"],
                   limit=node["limit"])
    float32 = None  # FP8: the norm-wise error against float32 of the same dequantized weights (reported)
    tolerance = FP8_TOLERANCE if fp8 else TOLERANCE[dtype_name]
    if group_size:
        want = int4_weights.moe_experts_reference(hidden, ids, routing, w_gate_up, scales[0], w_down, scales[1],
                                                  b_gate_up, b_down, group_size=group_size, **options).float()
    elif fp8:
        want = moe_experts_fp8.reference(hidden, ids, routing, (w_gate_up, scales[0]), (w_down, scales[1]), b_gate_up,
                                         b_down, **options).float()
        dense = moe_experts.reference(hidden.float(), ids, routing, moe_experts_fp8.dequantize(w_gate_up, scales[0]),
                                      moe_experts_fp8.dequantize(w_down, scales[1]), b_gate_up.float(), b_down.float(),
                                      **options)
        float32 = _norm_error(out, dense)
    else:
        want = moe_experts.reference(hidden, ids, routing, w_gate_up, w_down, b_gate_up, b_down, **options).float()
    relative = _norm_error(out, want) if fp8 else \
        (out.float() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    for _ in range(20):
        enqueue()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        enqueue()
    end.record()
    torch.cuda.synchronize()
    return {"relative": relative, "float32": float32, "us": start.elapsed_time(end) * 1000 / 200,
            "workspace": workspace.numel(), "ok": relative <= tolerance}


def _norm_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-6)).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", type=pathlib.Path)
    parser.add_argument("--lib", type=pathlib.Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("moe_plugin_check.py needs torch with a CUDA GPU; this one has none")
        return 2
    lib = _library(args.lib or args.nodes.parent / "libet_trt_moe_plugin_check.so")
    print(f"GPU: {torch.cuda.get_device_name()}")
    print("| blob | node | dtype | activation, layout | top-k | tokens | error (of max; FP8: norm-wise) | "
          "FP8: vs float32 (norm-wise) | enqueue (us) | result |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    for blob_name, nodes in json.loads(args.nodes.read_text()).items():
        blob_path = args.nodes.parent / blob_name
        blob, named = blob_path.read_bytes(), _named_data(blob_path)
        for node in nodes:
            node["activation_name"] = next(n for n, v in MOE_ACTIVATIONS.items() if v == node["activation"])
            error = ctypes.create_string_buffer(4096)
            handle = lib.et_trt_moe_plugin_check_create(blob, len(blob), *named, node["activation"],
                                                         node["gate_up_layout"].encode(), node["alpha"],
                                                         node["limit"], node.get("group_size", 0), error,
                                                         len(error))
            if not handle:
                print(f"| {blob_name} | {node['name']} | - | - | - | - | - | - | - | REFUSED: {error.value.decode()} |")
                failed = True
                continue
            weights = _weights(blob_path, node)
            # hidden's: the first weight input in bf16/fp16 (w_gate_up, or for INT4 and FP8 weights b_gate_up)
            dtype_name = next(n for w in weights if w is not None for n, d in DTYPES.items() if d == w.dtype)
            try:
                for top_k in TOP_K:
                    for tokens in TOKENS:
                        r = run_case(lib, handle, dtype_name, node, weights, tokens, top_k)
                        failed |= not r.get("ok", False)
                        result = r["error"] if "error" in r else ("ok" if r["ok"] else "MISMATCH")
                        fmt = f", INT4 g{node['group_size']}" if node.get("group_size") else \
                            ", FP8" if weights[0].dtype == torch.float8_e4m3fn else ""
                        float32 = "-" if r.get("float32") is None else f"{r['float32']:.2e}"
                        print(f"| {blob_name} | {node['name']} | {dtype_name}{fmt} | {node['activation_name']}, "
                              f"{node['gate_up_layout']} | {top_k} | {tokens} | {r.get('relative', float('nan')):.2e} "
                              f"| {float32} | {r.get('us', float('nan')):.1f} | {result} |")
            finally:
                lib.et_trt_moe_plugin_check_destroy(handle)
    print(f"every case ran and matched the float32 reference: {'no' if failed else 'yes'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
