"""Prepares, on this (CPU) machine, what benchmarks/device/moe_plugin_run.sh needs, into .device/plugin_run/.

    python benchmarks/device/prepare_plugin_run.py [--tensorrt DIR]   # then: moe_plugin_run.sh there, carry .device

.device/plugin_run/fused.pte, grouped.pte   the example policy (examples/moe_policy.py, its recipe) exported twice,
                        its MoE blocks one MoEExperts node each (the default) and GroupedMM nodes with the routing glue
                        around them (fused_experts = false); kernel images for sm_90a only; engine_build "never":
                        the device's TensorRT builds the engines at init, as on a robot
.device/plugin_run/t<N>_input_<i>.npy       the policy's inputs at N observation tokens (float32 holding the bf16
                        values: numpy has no bf16; et_trt_runner narrows them)
.device/plugin_run/t<N>_reference.npy       the policy's output on them in float32 (the model's weights as float32)
.device/executorch      the executorch wheel's runtime library, headers, CMake package and .ptd schema (the runtime's
                        build needs them; the device has no ExecuTorch)
.device/tensorrt/<version>/include   TensorRT's public headers of each version in ../shared/third_party/tensorrt
                        (the runtime is built against those of the TensorRT the device has)
.device/tensorrt/lib    with --tensorrt DIR: TensorRT's libraries (libnvinfer.so.*, libnvonnxparser.so.*) from DIR.
                        The device has no TensorRT, and a call carries at most 64 MiB: see moe_plugin_run.sh
.device/sysdeps/include zlib's and OpenSSL's headers of this machine (the device has their libraries, not
                        necessarily their headers)
.device/flatbuffers     flatc and the flatbuffers headers of this machine (prepare.py's copy)
.device/plugin_run/check/  the fused export's delegate blobs with their named data (runtime/tools/extract_blobs.py),
                        in int4/ those of the fused export with INT4 experts (expert_precision = "int4", int4.pte),
                        in fp8/ those with FP8 experts (expert_precision = "fp8", fp8.pte; also part 2's third form),
                        nodes.json (each MoEExperts node's attributes and weights' named data) and
                        libet_trt_moe_plugin_check.so (runtime/build-tensorrt-11.1, scripts/build_tensorrt_layers.sh):
                        runtime/tools/moe_plugin_check.py runs the plugin through its interfaces with no TensorRT
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import onnx
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.device.prepare import copy_flatbuffers  # noqa: E402
from et_trt_backend.plugin_names import MOE_EXPERTS_OP  # noqa: E402
from et_trt_backend.serialization.pte import read_partitions  # noqa: E402
from examples import moe_policy  # noqa: E402

OUT = ROOT / ".device"
RUN = OUT / "plugin_run"
TOKENS = (16, 512)  # a robot's observation count and the export's largest
TENSORRT_HEADERS = ROOT.parent / "shared" / "third_party" / "tensorrt"  # <version>/include
SYSTEM_HEADERS = ["/usr/include/zlib.h", "/usr/include/zconf.h", "/usr/include/openssl",
                  "/usr/include/x86_64-linux-gnu/openssl"]
# Kernel images for the device's H100/H200 alone: a call carries at most 64 MiB, the working tree included.
DEVICE_ARCHS = {"kernel_archs": ["sm_90a"]}
# fp8: the fused form with FP8 experts (every part: the decoder's bf16 blocks and the action head's fp16 one).
FORMS = {"fused": DEVICE_ARCHS, "grouped": {**DEVICE_ARCHS, "fused_experts": False},
         "fp8": {**DEVICE_ARCHS, "expert_precision": "fp8"}}
# The fused form with INT4 experts (every part; fp16's INT4 images too), for the plugin check only.
CHECK_FORMS = {"fused": "", "int4": "int4", "fp8": "fp8"}  # export -> its blobs' folder under check/
INT4_FORM = {**DEVICE_ARCHS, "expert_precision": "int4"}
CHECK_LIBRARY = ROOT / "runtime" / "build-tensorrt-11.1" / "libet_trt_moe_plugin_check.so"
ONNX_DTYPES = {onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.INT8: "int8",
               onnx.TensorProto.FLOAT8E4M3FN: "fp8", onnx.TensorProto.FLOAT: "f32"}


def recipe_text(overrides: dict) -> str:
    """The example's recipe with engine_build "never" and `overrides` in every part (over the part's own)."""
    recipe = tomllib.loads((ROOT / "examples" / "recipe.toml").read_text())
    lines = []
    for name, part in [("default", recipe["default"]), *((f"parts.{k}", v) for k, v in recipe["parts"].items())]:
        values = {**{k: v for k, v in part.items() if not isinstance(v, dict)}, "engine_build": "never", **overrides}
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
        for table, entries in ((k, v) for k, v in part.items() if isinstance(v, dict)):
            for sub, fields in entries.items():
                lines.append(f"[{name}.{table}.{sub}]")
                lines += [f"{key} = {_toml(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def export_forms() -> None:
    for form, overrides in {**FORMS, "int4": INT4_FORM}.items():
        recipe = RUN / f"{form}.toml"
        recipe.write_text(recipe_text(overrides))
        logging.info("exporting the example policy, %s form", form)
        subprocess.run([str(ROOT / ".venv" / "bin" / "et-trt"), "-q", "export", "--recipe", str(recipe), "--output",
                        str(RUN / f"{form}.pte")], check=True)


def save_inputs_and_references() -> None:
    """Inputs at each token count and the float32 policy's output on them."""
    policy = moe_policy.build_policy().float().eval()
    for tokens in TOKENS:
        inputs = [t.float() for t in moe_policy.example_inputs(num_tokens=tokens, seed=tokens)]
        for i, tensor in enumerate(inputs):
            np.save(RUN / f"t{tokens}_input_{i}.npy", tensor.numpy())
        with torch.no_grad():
            np.save(RUN / f"t{tokens}_reference.npy", policy(*inputs).numpy())


def _node_record(node: onnx.NodeProto, initializers: dict) -> dict:
    """A MoEExperts node's attributes and its weight inputs (w_gate_up, w_down, b_gate_up, b_down, and with INT4 or
    FP8 weights w_gate_up_scale, w_down_scale) as named data."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    weights = []
    for name in list(node.input[3:]) + [""] * (7 - len(node.input)):
        tensor = initializers.get(name)
        location = {e.key: e.value for e in tensor.external_data}.get("location") if tensor is not None else None
        if name and location is None:
            raise SystemExit(f"{node.name}: input {name} is not an initializer in named data")
        weights.append({"key": location, "shape": list(tensor.dims), "dtype": ONNX_DTYPES[tensor.data_type]}
                       if name else None)
    return {"name": node.name, "activation": attributes["activation"],
            "gate_up_layout": attributes["gate_up_layout"].decode(), "alpha": attributes["alpha"],
            "limit": attributes["limit"], "group_size": attributes.get("group_size", 0), "weights": weights}


def save_plugin_check() -> None:
    """The fused exports' blobs and named data, their MoEExperts nodes (nodes.json) and the check library."""
    check = RUN / "check"
    shutil.rmtree(check, ignore_errors=True)
    nodes = {}
    for form, folder in CHECK_FORMS.items():
        pte = RUN / f"{form}.pte"
        subprocess.run([sys.executable, str(ROOT / "runtime" / "tools" / "extract_blobs.py"), str(pte),
                        str(check / folder)], check=True)
        for i, partition in enumerate(read_partitions(pte.read_bytes(), data_dir=pte.parent)):
            model = onnx.load_from_string(partition.contents.onnx)
            initializers = {t.name: t for t in model.graph.initializer}
            blob_name = str(pathlib.PurePosixPath(folder, f"{partition.delegate.plan}_{i}.blob"))
            nodes[blob_name] = [_node_record(n, initializers) for n in model.graph.node if n.op_type == MOE_EXPERTS_OP]
    (check / "nodes.json").write_text(json.dumps(nodes, indent=1))
    if not CHECK_LIBRARY.exists():
        raise SystemExit(f"{CHECK_LIBRARY} is missing: run scripts/build_tensorrt_layers.sh 11.1 first")
    shutil.copy2(CHECK_LIBRARY, check)


def copy_executorch() -> None:
    """What building runtime/ needs of the executorch wheel: its libraries, headers, CMake package, .ptd schema."""
    import executorch

    package = pathlib.Path(executorch.__path__[0])
    target = OUT / "executorch"
    shutil.rmtree(target, ignore_errors=True)
    for part in ("lib", "include", "share", "extension/flat_tensor/serialize"):
        shutil.copytree(package / part, target / part, ignore=shutil.ignore_patterns("__pycache__", "*.py"))


def copy_tensorrt(libraries: pathlib.Path | None) -> None:
    target = OUT / "tensorrt"
    shutil.rmtree(target, ignore_errors=True)
    for include in TENSORRT_HEADERS.glob("*/include"):
        shutil.copytree(include, target / include.parent.name / "include")
    if libraries is not None:
        (target / "lib").mkdir()
        for pattern in ("libnvinfer.so*", "libnvinfer_builder_resource*.so*", "libnvonnxparser.so*"):
            for path in libraries.glob(pattern):
                shutil.copy2(path, target / "lib" / path.name, follow_symlinks=True)


def copy_system_headers() -> None:
    """zlib's and OpenSSL's headers, merged into one include folder (Debian splits OpenSSL's by architecture)."""
    target = OUT / "sysdeps" / "include"
    shutil.rmtree(target.parent, ignore_errors=True)
    target.mkdir(parents=True)
    for source in map(pathlib.Path, SYSTEM_HEADERS):
        if source.is_dir():
            shutil.copytree(source, target / source.name, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target / source.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensorrt", type=pathlib.Path, metavar="DIR",
                        help="a folder holding TensorRT's x86-64 CUDA 13 libraries, to carry")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    RUN.mkdir(parents=True, exist_ok=True)
    copy_flatbuffers()
    copy_executorch()
    copy_tensorrt(args.tensorrt)
    copy_system_headers()
    export_forms()
    save_inputs_and_references()
    save_plugin_check()
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    logging.info(".device: %.1f MiB (a device call carries at most 64 MiB with the working tree)", size / 2**20)


if __name__ == "__main__":
    main()
