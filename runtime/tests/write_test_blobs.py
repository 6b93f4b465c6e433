"""Writes the blobs and programs the C++ tests read into a directory (make_test_blobs.py calls write(), and
reuses what it wrote while nothing they are made from changed):

- writer_static.blob, writer_dynamic.blob: written by the Python writer
  (et_trt_backend/serialization/blob.py) from small hand-made partitions (an
  ONNX graph made with onnx.helper; no kernels, no engine; writer_dynamic with a
  check), each with a .expected sidecar listing what the C++ reader must read back.
- writer_weights.blob: a MatMul whose weight is external (named data), with
  that named data under writer_weights.named/ (one file per key, the key its
  path there, as runtime/tools/extract_blobs.py writes it) and in
  writer_weights.ptd, written by ExecuTorch's FlatTensorSerializer as an
  export's .ptd is.
- writer_mlp.blob, writer_mlp.ptd: two such MatMuls, their two weights in the .ptd.
- ranges/<option>_<value>_<accepted|refused>.blob: writer_static with each build
  option (options.BUILD_OPTIONS) at the ends of its range and one past each (an
  int), or at each of its choices and one that is not (a choice), written past
  the Python validation and named by whether the Python schema takes it: the C++
  reader, whose table the runtime's build generates from options.py, must take
  exactly those.
- example_<i>.blob: the delegate blobs of the example policy's .pte
  ($ET_TRT_EXAMPLE_PTE, else out/moe_policy.pte from scripts/setup.sh), when
  that file exists. They carry the records of real kernel images from the
  export (the images themselves are named data in the .pte).
- example.pte: a link to that .pte (make_test_blobs.py makes it), which the runner
  must refuse without TensorRT.
- cpu_mlp.pte: a program with no delegate (ExecuTorch's CPU kernels run it all),
  which the runner runs and times on any machine, under emulation too.
- exported_batch1.blob: the delegate blob of a small policy exported with
  Dim("batch", min=1) and Dim("tokens", min=1) through TensorRTPartitioner: its
  ranges start at 1, as the user exported them.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import onnx_ir as ir
import torch
from onnx import TensorProto, helper, numpy_helper

from et_trt_backend.options import BUILD_OPTIONS, CompileOptions, OptionsError, ShapeRange
from et_trt_backend.serialization.blob import (
    BlobContents,
    CheckSpec,
    DimSpec,
    TensorSpec,
    producer_versions,
    serialize,
)
from et_trt_backend.serialization.external_data import ALIGNMENT, move_weights_out


def _onnx_relu(dims: list[int | str], check: bool) -> bytes:
    """y = relu(x); with `check`, also ok = min(y) >= 0 (a bool scalar: a check's output)."""
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, dims)
    outputs = [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, dims)]
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    if check:
        outputs.append(helper.make_tensor_value_info("ok", TensorProto.BOOL, []))
        nodes += [helper.make_node("ReduceMin", ["y"], ["low"], keepdims=0),
                  helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.BFLOAT16,
                                                                                      [], [0.0])),
                  helper.make_node("GreaterOrEqual", ["low", "zero"], ["ok"])]
    graph = helper.make_graph(nodes, "relu", [x], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _contents(part: str, dims: list[DimSpec], options: CompileOptions, check: bool = False) -> BlobContents:
    onnx_dims = [d.name if d.size is None else d.size for d in dims]
    return BlobContents(
        part=part,
        inputs=[TensorSpec("x", torch.bfloat16, dims)],
        outputs=[TensorSpec("y", torch.bfloat16, dims)],
        options=options,
        onnx=_onnx_relu(onnx_dims, check),
        kernels=[],
        engines=[],
        producer=producer_versions(onnx_opset=18),
        checks=[CheckSpec(TensorSpec("ok", torch.bool, []), "relu gave a negative value")] if check else [],
    )


def _expected(contents: BlobContents) -> str:
    """What the C++ reader must read back, one `key values...` line each (no spaces in names)."""
    dtype_codes = {torch.bfloat16: 15, torch.float16: 5, torch.float32: 6, torch.int32: 3, torch.int64: 4}

    def spec(kind: str, s: TensorSpec) -> str:
        dims = " ".join(f"{-1 if d.size is None else d.size}:{d.name}:{d.min}:{d.opt}:{d.max}" for d in s.dims)
        return f"{kind} {s.name} {dtype_codes[s.dtype]} {dims}".rstrip()

    lines = [f"part {contents.part}"]
    lines += [spec("input", s) for s in contents.inputs] + [spec("output", s) for s in contents.outputs]
    lines += [f"check {c.output.name} {c.message}" for c in contents.checks]
    lines += [
        f"onnx_size {len(contents.onnx)}",
    ]
    # Every build option as the C++ reader must read it back ("none": no value, the builder's own default).
    for name in BUILD_OPTIONS:
        value = getattr(contents.options, name)
        text = "none" if value is None else ("true" if value else "false") if isinstance(value, bool) else value
        lines.append(f"option {name} {text}")
    return "\n".join(lines) + "\n"


def _write(out: pathlib.Path, name: str, contents: BlobContents) -> None:
    (out / f"{name}.blob").write_bytes(serialize(contents))
    (out / f"{name}.expected").write_text(_expected(contents))


def _edge_values(values: range | tuple[str, ...]) -> list[int | str]:
    """The ends of an int's range and one past each (those an int64 holds), or a choice's choices and one more."""
    if isinstance(values, tuple):
        return [*values, "not_a_choice"]
    edges = [values[0] - 1, values[0], values[-1], values[-1] + 1]
    return [value for value in edges if -(1 << 63) <= value < 1 << 63]


def _write_ranges(out: pathlib.Path, contents: BlobContents) -> None:
    out.mkdir()
    for name, option in BUILD_OPTIONS.items():
        for value in [] if option.kind is bool else _edge_values(option.values):
            options = dataclasses.replace(contents.options, **{name: value})  # not validated: a raw value
            try:
                option.check(name, value)
                verdict = "accepted"
            except OptionsError:
                verdict = "refused"
            (out / f"{name}_{value}_{verdict}.blob").write_bytes(
                serialize(dataclasses.replace(contents, options=options)))


def _weights_contents(part: str, shapes: list[tuple[int, int]], data_file: str, seed: int) -> BlobContents:
    """x @ w @ w1 ... with float32 weights of `shapes` (each 1 KiB or more: external), random from `seed`."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w{i}" if i else "w")
               for i, shape in enumerate(shapes)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, shapes[0][0]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, shapes[-1][1]])
    names = ["x"] + [f"h{i}" for i in range(1, len(shapes))] + ["y"]
    nodes = [helper.make_node("MatMul", [names[i], w.name], [names[i + 1]]) for i, w in enumerate(weights)]
    graph = helper.make_graph(nodes, "matmul", [x], [y], weights)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    records = move_weights_out(model)
    dims = lambda *sizes: [DimSpec(s, f"x:{i}", s, s, s) for i, s in enumerate(sizes)]  # noqa: E731
    return BlobContents(part=part, inputs=[TensorSpec("x", torch.float32, dims(4, shapes[0][0]))],
                        outputs=[TensorSpec("y", torch.float32, dims(4, shapes[-1][1]))],
                        options=CompileOptions(precision="fp32"),
                        onnx=ir.serde.serialize_model(model).SerializeToString(), kernels=[], engines=[],
                        producer=producer_versions(18), weights=records, data_file=data_file)


def _write_ptd(path: pathlib.Path, named: dict[str, bytes]) -> None:
    """A data file holding `named` (key -> bytes), as ExecuTorch writes an export's .ptd."""
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    keys = sorted(named)
    payload = DataPayload(buffers=[named[key] for key in keys],
                          named_data={key: DataEntry(i, ALIGNMENT, None) for i, key in enumerate(keys)})
    path.write_bytes(bytes(FlatTensorSerializer().serialize(payload)))


def _cpu_program() -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 4)

        def forward(self, x):
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    program = torch.export.export(Mlp().eval(), (torch.randn(3, 6),))
    return to_edge_transform_and_lower(program).to_executorch().buffer


def _exported_batch1_blob() -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_partitioner import TensorRTPartitioner

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.down(torch.nn.functional.gelu(self.up(x)))

    torch.manual_seed(0)
    dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("tokens", min=1, max=64)}
    program = torch.export.export(Mlp().to(torch.bfloat16).eval(), (torch.randn(2, 5, 16, dtype=torch.bfloat16),),
                                  dynamic_shapes=(dims,))
    edge = to_edge_transform_and_lower(program, partitioner=[TensorRTPartitioner({"default": {"engine_build": "never"}})])
    (module,) = [m for name, m in edge.exported_program().graph_module.named_children() if name.startswith("lowered")]
    return module.processed_bytes


def write(out: pathlib.Path, pte: pathlib.Path) -> None:
    """Everything above into the empty folder `out`; the example's blobs from `pte` when it exists."""
    weights = _weights_contents("head", [(16, 32)], "policy.ptd", seed=0)
    _write(out, "writer_weights", weights)
    for data in weights.named_data():
        (out / "writer_weights.named" / data.key).parent.mkdir(parents=True, exist_ok=True)
        (out / "writer_weights.named" / data.key).write_bytes(data.bytes())
    _write_ptd(out / "writer_weights.ptd", {data.key: data.bytes() for data in weights.named_data()})
    mlp = _weights_contents("mlp", [(16, 32), (32, 24)], "writer_mlp.ptd", seed=1)
    _write(out, "writer_mlp", mlp)
    _write_ptd(out / "writer_mlp.ptd", {data.key: data.bytes() for data in mlp.named_data()})
    static = _contents("encoder", [DimSpec(4, "x:0", 4, 4, 4), DimSpec(16, "x:1", 16, 16, 16)], CompileOptions())
    _write(out, "writer_static", static)
    _write_ranges(out / "ranges", static)
    dynamic = CompileOptions(precision="fp16", tf32=False, optimization_level=5, workspace_bytes=1 << 30,
                             shape_ranges={"tokens": ShapeRange(2, 64, 512)})
    _write(out, "writer_dynamic", _contents("decoder.layers.0", [DimSpec(None, "tokens", 2, 64, 512),
                                                                 DimSpec(16, "x:1", 16, 16, 16)], dynamic, check=True))

    (out / "cpu_mlp.pte").write_bytes(_cpu_program())
    (out / "exported_batch1.blob").write_bytes(_exported_batch1_blob())

    if pte.is_file():
        from et_trt_backend import BACKEND_ID
        from et_trt_backend.serialization.pte import read_delegates, read_partitions

        blobs = [d.data for d in read_delegates(pte.read_bytes()) if d.backend_id == BACKEND_ID]
        for i, blob in enumerate(blobs):
            (out / f"example_{i}.blob").write_bytes(blob)
        _write_ptd(out / "example.ptd", {key: data for part in read_partitions(pte.read_bytes(), data_dir=pte.parent)
                                         for key, data in ((d.key, d.bytes()) for d in part.contents.named_data())})
        print(f"{len(blobs)} example blobs from {pte}")
    else:
        print(f"no example .pte at {pte}: only writer blobs (run scripts/setup.sh to export it)")

