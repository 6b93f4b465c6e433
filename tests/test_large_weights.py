"""A partition beyond the 2 GiB protobuf and flatbuffers stop: a MoE layer with 2.26 GB of expert
weights (bf16, 40 experts, hidden 3072, FFN 3072) exported with its weights in a .ptd, then loaded
through ExecuTorch's runtime as far as this machine allows: the delegate fetches and checks every
weight from the .ptd, and TensorRT's absence is the only refusal.

The export runs in a fresh process whose peak resident memory is measured (getrusage): it must stay
within 2.5x the weights' size, everything included (the model itself, torch, ExecuTorch). Its MoE block takes the
fused form (one MoEExperts node, its gate+up weights laid out anew), and the model's weights, which the backend
shares with its program instead of copying them, are unchanged after it.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import onnx
import pytest

from et_trt_backend.lowering.moe_fusion import FUSED
from et_trt_backend.onnx_analysis import moe_blocks
from et_trt_backend.serialization.pte import read_partitions
from support.runtime_runs import NOT_BUILT

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPERTS, HIDDEN, FFN = 40, 3072, 3072
WEIGHT_BYTES = (EXPERTS * 3 * HIDDEN * FFN + HIDDEN * EXPERTS) * 2  # gate+up [E, 2F, H], down [E, H, F], router; bf16

EXPORT = textwrap.dedent(f"""
    import hashlib, json, resource, sys, time
    import torch
    sys.path.insert(0, {str(REPO / "tests")!r})
    from support import moe_models
    from executorch.exir import to_edge_transform_and_lower
    from et_trt_partitioner import TensorRTPartitioner
    from et_trt_backend.serialization import external_data

    out = sys.argv[1]
    with torch.device("meta"):  # no float32 copy of the weights while building the model
        model = moe_models.GroupedMoE(hidden={HIDDEN}, ffn={FFN}, experts={EXPERTS}, top_k=2)
    model = model.to_empty(device="cpu").to(torch.bfloat16).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02, generator=generator)
    weights = sum(p.nbytes for p in model.parameters())

    def digest():
        return [hashlib.sha256(p.detach().view(torch.int16).numpy()).hexdigest() for p in model.parameters()]

    before = digest()
    start = time.perf_counter()
    exported = moe_models.export(model, hidden={HIDDEN})
    external_data.tag_weights(exported, "big")
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(
        {{"default": {{"kernel_archs": ["sm_90a"], "engine_build": "never"}}}})])
    program = edge.to_executorch()
    program.write_tensor_data_to_file(out)
    with open(out + "/big.pte", "wb") as f:
        program.write_to_file(f)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = time.perf_counter() - start
    print(json.dumps({{"weights": weights, "peak_rss": peak, "seconds": seconds, "unchanged": digest() == before}}))
""")

LOAD = textwrap.dedent("""
    import sys
    from executorch.runtime import Runtime
    from et_trt_backend import runtime
    runtime.load()
    program = Runtime.get().load_program(sys.argv[1] + "/big.pte", data_path=sys.argv[1] + "/big.ptd")
    try:
        program.load_method("forward")
    except Exception:
        sys.exit(3)
""")


@pytest.mark.slow
def test_a_partition_of_more_than_2_gib_exports_and_loads(built_runtime, tmp_path):
    export = subprocess.run([sys.executable, "-c", EXPORT, str(tmp_path)], capture_output=True, text=True,
                            timeout=3000)
    assert export.returncode == 0, export.stderr[-5000:]
    measured = json.loads(export.stdout.strip().splitlines()[-1])
    print(f"weights {measured['weights'] / 1e9:.2f} GB, export peak RSS {measured['peak_rss'] / 1e9:.2f} GB "
          f"({measured['peak_rss'] / measured['weights']:.2f}x), {measured['seconds']:.0f} s")
    assert measured["weights"] == WEIGHT_BYTES > 2**31
    assert measured["peak_rss"] <= 2.5 * measured["weights"], measured
    assert measured["unchanged"], "the export wrote into the model's weights"
    ptd, pte = tmp_path / "big.ptd", tmp_path / "big.pte"
    assert ptd.stat().st_size >= WEIGHT_BYTES and pte.stat().st_size < 2**20
    (partition,) = read_partitions(pte.read_bytes(), missing_data_ok=True)
    assert [b["form"] for b in moe_blocks(onnx.load_from_string(partition.contents.onnx))] == [FUSED]

    load = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path)], capture_output=True, text=True,
                          errors="replace", timeout=1200)
    assert load.returncode == 3, (load.returncode, load.stderr[-3000:])  # refused at init, not crashed
    assert NOT_BUILT in load.stderr, load.stderr[-3000:]  # every weight fetched and checked: only TensorRT is missing
