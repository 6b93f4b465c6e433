"""The delegate blob: writer and reader.

One blob per partition: a fixed header (magic, schema version, crc32, payload
size, sha256 content id; layout at the top of schema.fbs) followed by a
flatbuffer whose root is `Blob`. The flatbuffer is built and read only through
the flatc-generated `schema_generated.py`, the same schema the C++ runtime is
generated from.

The partition's weights and engines are not in the blob: they are ExecuTorch
named data (table NamedData), which the blob names by key, size and sha256.
`deserialize` leaves them unresolved (`NamedData.data` None);
serialization/named_data.py attaches them from the program's named data.

`deserialize` refuses anything it cannot vouch for (wrong magic or version,
size mismatch, checksum or content-id mismatch, a malformed flatbuffer,
values outside the schema) with a `BlobError` that says what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import zlib
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

import flatbuffers
import torch

from et_trt_backend.serialization.kernel_image import SCHEMA_NAMES as KERNEL_IMAGE_SCHEMA_NAMES
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.serialization.named_data import NAMED_DATA_PREFIX, NamedData
from et_trt_backend.options import BUILD_OPTIONS, CompileOptions, OptionsError, parse_options
from et_trt_backend.serialization import schema_generated as fb

MAGIC = b"ETTRTBLB"
# Bump on any change an older reader cannot read (and in runtime/ too).
# 3: weights and engines in ExecuTorch's named data; build_options holds only what the runtime reads.
# 4: build_options are name/value entries, checked against the table the runtime generates from options.py.
SCHEMA_VERSION = 4
FILE_IDENTIFIER = b"ETRT"

# magic, schema version, crc32 of bytes [16:], payload size, sha256 of payload
_HEADER = struct.Struct("<8sIIQ32s")
HEADER_SIZE = _HEADER.size  # 56
_CRC_START = 16
# A flatbuffer addresses at most 2 GiB (32-bit signed offsets).
MAX_PAYLOAD_BYTES = (1 << 31) - 1

# ExecuTorch ScalarType codes (the DType enum's values) <-> torch dtypes.
_DTYPE_TO_FB = {
    torch.uint8: fb.DType.UInt8,
    torch.int8: fb.DType.Int8,
    torch.int16: fb.DType.Int16,
    torch.int32: fb.DType.Int32,
    torch.int64: fb.DType.Int64,
    torch.float16: fb.DType.Float16,
    torch.float32: fb.DType.Float32,
    torch.float64: fb.DType.Float64,
    torch.bool: fb.DType.Bool,
    torch.bfloat16: fb.DType.BFloat16,
}
_FB_TO_DTYPE = {v: k for k, v in _DTYPE_TO_FB.items()}
# Kernel element types, as named by et_trt_backend.kernels.
_KERNEL_DTYPE_TO_FB = {"bf16": fb.DType.BFloat16, "fp16": fb.DType.Float16}
_FB_TO_KERNEL_DTYPE = {v: k for k, v in _KERNEL_DTYPE_TO_FB.items()}
_IMAGE_FORMAT_TO_FB = {"cubin": fb.ImageFormat.Cubin, "ptx": fb.ImageFormat.Ptx}
_FB_TO_IMAGE_FORMAT = {v: k for k, v in _IMAGE_FORMAT_TO_FB.items()}
_WEIGHT_FORMAT_TO_FB = {"dense": fb.WeightFormat.Dense, "fp8": fb.WeightFormat.Float8RowScaled,
                        "int4": fb.WeightFormat.Int4GroupScaled}
_FB_TO_WEIGHT_FORMAT = {v: k for k, v in _WEIGHT_FORMAT_TO_FB.items()}
# Engine providers, as et-trt names them (inspect, logs).
PROVIDERS = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT for RTX"}
_PROVIDER_TO_FB = {"tensorrt": fb.Provider.TensorRT, "tensorrt_rtx": fb.Provider.TensorRTRTX}
_FB_TO_PROVIDER = {v: k for k, v in _PROVIDER_TO_FB.items()}
# A build option's kind (options.BuildOption) -> its entry's value type (schema.fbs, union OptionValue), that
# type's table and the kind's name in messages (as the C++ reader's, runtime/src/build_options.cc).
_OPTION_VALUES = {bool: (fb.OptionValue.BoolValue, fb.BoolValueT, "bool"),
                  int: (fb.OptionValue.IntValue, fb.IntValueT, "int"),
                  str: (fb.OptionValue.ChoiceValue, fb.ChoiceValueT, "choice")}
_OPTION_VALUE_NAMES = {code: name for name, code in vars(fb.OptionValue).items() if not name.startswith("_")}

# Every CompileOptions field is either a build option (options.build_option: the
# runtime reads it from the blob's build_options entries to build the engine as
# export would) or export-only, in the blob's export_options JSON (for inspect and
# check), never both. tests/test_blob.py fails when a new option is in neither set.
EXPORT_ONLY_OPTIONS = {
    "precision": "written into the ONNX's tensor types (the network is strongly typed)",
    "truncate_double": "the ONNX computes the model's float64 in float32",
    "shape_ranges": "carried by the IO specs (Dim.min/opt/max)",
    "kernel_archs": "the embedded kernel images are the result",
    "grouped_gemm_kernel": "the ONNX has GroupedMM nodes or their dense form",
    "fused_experts": "the ONNX has MoEExperts nodes or the GroupedMM form",
    "expert_precision": "the ONNX's GroupedMM (and, INT4, MoEExperts) nodes carry FP8 or INT4 weights and their scales",
    "int4_group_size": "the ONNX's INT4 nodes carry it (their attribute group_size)",
    "engine_build": "decides what is embedded at export",
    "preflight": "applies at export only",
    # A path on the export machine: export-time builds read it; the robot's cannot.
    "timing_cache": "read by engine builds at export",
}

# Producer keys and their types (table Producer).
PRODUCER_FIELDS: dict[str, type] = {
    "et_trt": str,
    "torch": str,
    "executorch": str,
    "onnx_opset": int,
    "triton": str,
    "tensorrt": str,
}


class BlobError(ValueError):
    """A blob cannot be written or read; the message names what is wrong."""


@dataclasses.dataclass
class DimSpec:
    """One dimension; size None = dynamic, with the profile range min/opt/max."""

    size: int | None
    name: str
    min: int
    opt: int
    max: int


@dataclasses.dataclass
class TensorSpec:
    name: str  # the ONNX graph input/output name (TensorRT binding name)
    dtype: torch.dtype
    dims: list[DimSpec]


@dataclasses.dataclass
class CheckSpec:
    """A check on the data (table Check): the engine's bool scalar `output`, not a delegate output; the runtime
    fails the call with `message` where it is false."""

    output: TensorSpec
    message: str


@dataclasses.dataclass
class WeightRecord:
    """An ONNX initializer whose bytes are named data (table Weight)."""

    name: str
    data: NamedData


@dataclasses.dataclass
class EngineRecord:
    plan: NamedData
    provider: str  # a key of PROVIDERS
    tensorrt_version: str  # the provider library's version
    gpu_name: str  # the GPU it was built on; "" for an ahead-of-time build (TensorRT for RTX)
    compute_capability: int  # the target: major * 10 + minor
    options_not_applied: list[str] = dataclasses.field(default_factory=list)  # partition options the build skipped, why


@dataclasses.dataclass
class BlobContents:
    part: str
    inputs: list[TensorSpec]  # in the delegate call's argument order
    outputs: list[TensorSpec]
    options: CompileOptions
    onnx: bytes  # initializers of 1 KiB or more are external: `weights`
    kernels: list[KernelImage]
    engines: list[EngineRecord]  # empty: the device builds the engine from the ONNX
    producer: dict[str, str | int]
    weights: list[WeightRecord] = dataclasses.field(default_factory=list)
    data_file: str = ""  # the .ptd holding the named data; "" = the .pte
    checks: list[CheckSpec] = dataclasses.field(default_factory=list)  # engine outputs the runtime checks

    def named_data(self) -> list[NamedData]:
        """Every NamedData the blob names: the weights', the kernel images', the engines'."""
        return [w.data for w in self.weights] + [k.image for k in self.kernels] + [e.plan for e in self.engines]


@dataclasses.dataclass(frozen=True)
class BlobHeader:
    schema_version: int
    crc32: int
    payload_size: int
    content_id: str  # sha256 of the payload, hex


def producer_versions(onnx_opset: int, **extra: str) -> dict[str, str | int]:
    """Producer record for a blob made now: this package, torch, executorch,
    the ONNX opset, plus `extra` (triton, cuda, tensorrt) where used."""
    import executorch.version

    import et_trt_backend

    producer: dict[str, str | int] = {key: kind() for key, kind in PRODUCER_FIELDS.items()}
    producer.update(
        et_trt=et_trt_backend.__version__,
        torch=torch.__version__,
        executorch=executorch.version.__version__,
        onnx_opset=onnx_opset,
        **extra,
    )
    _check_producer(producer)
    return producer


# ---- writing ---------------------------------------------------------------
def serialize(contents: BlobContents) -> bytes:
    """The blob of one partition: header + flatbuffer payload."""
    _check_producer(contents.producer)
    payload_hint = len(contents.onnx)
    if payload_hint > MAX_PAYLOAD_BYTES:
        raise BlobError(
            f"part '{contents.part}': its ONNX graph of {payload_hint} bytes (weights apart) exceeds the "
            "2 GiB a flatbuffer can address; split the model into smaller parts in the recipe"
        )
    builder = flatbuffers.Builder(payload_hint + 4096)

    # Children first: a flatbuffer is built back to front.
    part = builder.CreateString(contents.part)
    producer = _build_producer(builder, contents.producer)
    inputs = _build_tensor_vector(builder, contents.inputs, fb.BlobStartInputsVector, "input")
    outputs = _build_tensor_vector(builder, contents.outputs, fb.BlobStartOutputsVector, "output")
    build_options = _build_options(builder, contents.options)
    export_options = builder.CreateString(json.dumps(_export_options(contents.options), sort_keys=True))
    onnx = builder.CreateByteVector(bytes(contents.onnx))
    weights = _build_vector(builder, [_build_weight(builder, w) for w in contents.weights],
                            fb.BlobStartWeightsVector)
    kernels = _build_vector(builder, [_build_kernel(builder, k) for k in contents.kernels],
                            fb.BlobStartKernelsVector)
    engines = _build_vector(builder, [_build_engine(builder, e) for e in contents.engines],
                            fb.BlobStartEnginesVector)
    data_file = builder.CreateString(contents.data_file)
    checks = _build_vector(builder, [_build_check(builder, c, f"check {i}") for i, c in enumerate(contents.checks)],
                           fb.BlobStartChecksVector)

    fb.BlobStart(builder)
    fb.BlobAddPart(builder, part)
    fb.BlobAddProducer(builder, producer)
    fb.BlobAddInputs(builder, inputs)
    fb.BlobAddOutputs(builder, outputs)
    fb.BlobAddBuildOptions(builder, build_options)
    fb.BlobAddExportOptions(builder, export_options)
    fb.BlobAddOnnx(builder, onnx)
    fb.BlobAddWeights(builder, weights)
    fb.BlobAddKernels(builder, kernels)
    fb.BlobAddEngines(builder, engines)
    fb.BlobAddDataFile(builder, data_file)
    fb.BlobAddChecks(builder, checks)
    builder.Finish(fb.BlobEnd(builder), file_identifier=FILE_IDENTIFIER)
    payload = bytes(builder.Output())
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BlobError(f"part '{contents.part}': payload of {len(payload)} bytes exceeds 2 GiB")

    tail = struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload
    crc = zlib.crc32(tail)
    return MAGIC + struct.pack("<II", SCHEMA_VERSION, crc) + tail


def _check_producer(producer: dict[str, str | int]) -> None:
    for key, value in producer.items():
        kind = PRODUCER_FIELDS.get(key)
        if kind is None:
            raise BlobError(f"producer key '{key}' is not in the schema; known keys: {', '.join(PRODUCER_FIELDS)}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BlobError(f"producer '{key}' must be {kind.__name__}, got {value!r}")


def _build_producer(builder: flatbuffers.Builder, producer: dict[str, str | int]) -> int:
    strings = {k: builder.CreateString(v) for k, v in producer.items() if PRODUCER_FIELDS[k] is str}
    fb.ProducerStart(builder)
    adders: dict[str, Callable[[Any, Any], None]] = {
        "et_trt": fb.ProducerAddEtTrt, "torch": fb.ProducerAddTorch, "executorch": fb.ProducerAddExecutorch,
        "triton": fb.ProducerAddTriton, "tensorrt": fb.ProducerAddTensorrt,
    }
    for key, offset in strings.items():
        adders[key](builder, offset)
    if "onnx_opset" in producer:
        fb.ProducerAddOnnxOpset(builder, producer["onnx_opset"])
    return fb.ProducerEnd(builder)


def _build_vector(builder: flatbuffers.Builder, offsets: list[int], start: Callable[[Any, int], Any]) -> int:
    start(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def _build_tensor_vector(builder, specs: list[TensorSpec], start, kind: str) -> int:
    return _build_vector(builder, [_build_tensor(builder, s, f"{kind} {i}") for i, s in enumerate(specs)], start)


def _build_tensor(builder: flatbuffers.Builder, spec: TensorSpec, where: str) -> int:
    if not spec.name:
        raise BlobError(f"{where}: tensor spec has no name; use the ONNX graph's {where.split()[0]} name")
    where = f"{where} '{spec.name}'"
    if spec.dtype not in _DTYPE_TO_FB:
        raise BlobError(f"{where}: dtype {spec.dtype} has no blob code; supported: {sorted(map(str, _DTYPE_TO_FB))}")
    dims = [_build_dim(builder, d, f"{where} axis {axis}") for axis, d in enumerate(spec.dims)]
    name = builder.CreateString(spec.name)
    dims_vector = _build_vector(builder, dims, fb.TensorSpecStartDimsVector)
    fb.TensorSpecStart(builder)
    fb.TensorSpecAddName(builder, name)
    fb.TensorSpecAddDtype(builder, _DTYPE_TO_FB[spec.dtype])
    fb.TensorSpecAddDims(builder, dims_vector)
    return fb.TensorSpecEnd(builder)


def _build_check(builder: flatbuffers.Builder, check: CheckSpec, where: str) -> int:
    _check_check(check, where)
    output = _build_tensor(builder, check.output, where)
    message = builder.CreateString(check.message)
    fb.CheckStart(builder)
    fb.CheckAddOutput(builder, output)
    fb.CheckAddMessage(builder, message)
    return fb.CheckEnd(builder)


def _check_check(check: CheckSpec, where: str) -> None:
    if check.output.dtype != torch.bool or check.output.dims:
        raise BlobError(f"{where} '{check.output.name}': a check's output is a bool scalar, not "
                        f"{check.output.dtype} of {len(check.output.dims)} dimension(s)")
    if not check.message:
        raise BlobError(f"{where} '{check.output.name}' has no message")


def _check_dim(dim: DimSpec, where: str) -> None:
    if dim.size is None:
        if not 0 <= dim.min <= dim.opt <= dim.max:
            raise BlobError(f"{where}: dynamic range needs 0 <= min <= opt <= max, got {dim.min}, {dim.opt}, {dim.max}")
    elif not (dim.size >= 0 and dim.min == dim.opt == dim.max == dim.size):
        raise BlobError(
            f"{where}: static size {dim.size} needs min = opt = max = size, got {dim.min}, {dim.opt}, {dim.max}"
        )


def _build_dim(builder: flatbuffers.Builder, dim: DimSpec, where: str) -> int:
    _check_dim(dim, where)
    name = builder.CreateString(dim.name)
    fb.DimStart(builder)
    fb.DimAddSize(builder, -1 if dim.size is None else dim.size)
    fb.DimAddName(builder, name)
    fb.DimAddMin(builder, dim.min)
    fb.DimAddOpt(builder, dim.opt)
    fb.DimAddMax(builder, dim.max)
    return fb.DimEnd(builder)


def _build_options(builder: flatbuffers.Builder, options: CompileOptions) -> int:
    entries = []
    for name, spec in BUILD_OPTIONS.items():
        value = getattr(options, name)
        if value is None:  # no entry: the builder's own default
            continue
        entry = fb.BuildOptionT()
        entry.name = name
        entry.valueType, value_table, _ = _OPTION_VALUES[spec.kind]
        entry.value = value_table()
        entry.value.value = value
        entries.append(entry.Pack(builder))
    return _build_vector(builder, entries, fb.BlobStartBuildOptionsVector)


def _export_options(options: CompileOptions) -> dict[str, Any]:
    return {key: value for key, value in options.to_json().items() if key in EXPORT_ONLY_OPTIONS}


def _named_data_table(data: NamedData) -> fb.NamedDataT:
    if not data.key.startswith(NAMED_DATA_PREFIX) or len(data.sha256) != 32:
        raise BlobError(f"named data {data.key!r}: the key must start with {NAMED_DATA_PREFIX!r} and the sha256 "
                        f"be 32 bytes, got {len(data.sha256)}")
    table = fb.NamedDataT()
    table.key, table.size, table.sha256 = data.key, data.size, list(data.sha256)
    return table


def _build_named_data(builder: flatbuffers.Builder, data: NamedData) -> int:
    return _named_data_table(data).Pack(builder)


def _build_weight(builder: flatbuffers.Builder, weight: WeightRecord) -> int:
    name = builder.CreateString(weight.name)
    data = _build_named_data(builder, weight.data)
    fb.WeightStart(builder)
    fb.WeightAddName(builder, name)
    fb.WeightAddData(builder, data)
    return fb.WeightEnd(builder)


def _build_kernel(builder: flatbuffers.Builder, k: KernelImage) -> int:
    where = f"kernel image '{k.kernel}' ({k.arch}, {k.format})"
    if k.format not in _IMAGE_FORMAT_TO_FB:
        raise BlobError(f"{where}: format must be one of {', '.join(_IMAGE_FORMAT_TO_FB)}")
    if k.dtype not in _KERNEL_DTYPE_TO_FB:
        raise BlobError(f"{where}: dtype must be one of {', '.join(_KERNEL_DTYPE_TO_FB)}, got {k.dtype!r}")
    if k.weight_format not in _WEIGHT_FORMAT_TO_FB:
        raise BlobError(f"{where}: weight_format must be one of {', '.join(_WEIGHT_FORMAT_TO_FB)}, "
                        f"got {k.weight_format!r}")
    table = fb.KernelImageT()
    for field, name in KERNEL_IMAGE_SCHEMA_NAMES.items():
        setattr(table, name, getattr(k, field))
    table.format = _IMAGE_FORMAT_TO_FB[k.format]
    table.dtype = _KERNEL_DTYPE_TO_FB[k.dtype]
    table.weightFormat = _WEIGHT_FORMAT_TO_FB[k.weight_format]
    table.image = _named_data_table(k.image)
    return table.Pack(builder)


def kernel_images_flatbuffer(images: Sequence[KernelImage]) -> bytes:
    """A flatbuffer whose root Blob holds only `images` (no blob header): how the launcher's C ABI
    takes kernel images (runtime/kernels/grouped_mm_capi.h)."""
    builder = flatbuffers.Builder(1024)
    kernels = _build_vector(builder, [_build_kernel(builder, k) for k in images], fb.BlobStartKernelsVector)
    fb.BlobStart(builder)
    fb.BlobAddKernels(builder, kernels)
    builder.Finish(fb.BlobEnd(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def _build_engine(builder: flatbuffers.Builder, engine: EngineRecord) -> int:
    if engine.provider not in _PROVIDER_TO_FB:
        raise BlobError(f"engine provider {engine.provider!r} is not one of {', '.join(_PROVIDER_TO_FB)}")
    if not engine.plan.size or not engine.tensorrt_version:
        raise BlobError(f"{PROVIDERS[engine.provider]} engine for sm_{engine.compute_capability}: "
                        "empty plan or no version")
    plan = _build_named_data(builder, engine.plan)
    version = builder.CreateString(engine.tensorrt_version)
    gpu = builder.CreateString(engine.gpu_name)
    not_applied = _build_vector(builder, [builder.CreateString(note) for note in engine.options_not_applied],
                                fb.EngineStartOptionsNotAppliedVector)
    fb.EngineStart(builder)
    fb.EngineAddPlan(builder, plan)
    fb.EngineAddProvider(builder, _PROVIDER_TO_FB[engine.provider])
    fb.EngineAddTensorrtVersion(builder, version)
    fb.EngineAddGpuName(builder, gpu)
    fb.EngineAddComputeCapability(builder, engine.compute_capability)
    fb.EngineAddOptionsNotApplied(builder, not_applied)
    return fb.EngineEnd(builder)


# ---- reading ---------------------------------------------------------------
def read_header(data: bytes) -> BlobHeader:
    """The verified header: magic, version, size, crc32 and content id all checked."""
    data = memoryview(data)
    if len(data) < HEADER_SIZE:
        raise BlobError(f"blob is {len(data)} bytes, shorter than its {HEADER_SIZE}-byte header: truncated")
    magic, version, crc, size, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BlobError(f"not an et-trt blob: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != SCHEMA_VERSION:
        raise BlobError(
            f"blob schema version {version}, this reader reads version {SCHEMA_VERSION}; "
            "re-export the model with this et-trt version"
        )
    actual = len(data) - HEADER_SIZE
    if size != actual:
        raise BlobError(f"blob payload is {actual} bytes but its header says {size}: truncated or extended")
    if zlib.crc32(data[_CRC_START:]) != crc:
        raise BlobError("blob crc32 mismatch: the blob is corrupted")
    if hashlib.sha256(data[HEADER_SIZE:]).digest() != digest:
        raise BlobError("blob content id (sha256) does not match its payload: the blob is corrupted")
    return BlobHeader(version, crc, size, digest.hex())


def deserialize(data: bytes) -> BlobContents:
    """The contents of a blob written by `serialize`; BlobError if it is not one."""
    read_header(data)
    payload = bytes(data[HEADER_SIZE:])
    if len(payload) < 8 or not fb.Blob.BlobBufferHasIdentifier(payload, 0):
        raise BlobError(f"blob payload lacks the flatbuffer file identifier {FILE_IDENTIFIER!r}")
    try:
        return _read_blob(payload)
    except BlobError:
        raise
    except Exception as e:  # the Python flatbuffers runtime has no verifier
        raise BlobError(f"malformed blob flatbuffer ({type(e).__name__}: {e})") from e


T = TypeVar("T")


def _vector(length: int, item: Callable[[int], T], what: str, payload: bytes, elem_bytes: int = 4) -> list[T]:
    # A corrupt length must not make us loop over billions of entries.
    if length * elem_bytes > len(payload):
        raise BlobError(f"blob field {what}: length {length} exceeds the payload")
    return [item(i) for i in range(length)]


def _bytes(table: Any, field: str, payload: bytes) -> bytes:
    if getattr(table, f"{field}IsNone")():
        return b""
    length = getattr(table, f"{field}Length")()
    if length > len(payload):
        raise BlobError(f"blob field {field}: length {length} exceeds the payload")
    return getattr(table, f"{field}AsNumpy")().tobytes()


def _str(value: bytes | None, what: str) -> str:
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BlobError(f"blob field {what} is not UTF-8: {e}") from None


def _enum(value: int, mapping: dict[int, T], what: str) -> T:
    if value not in mapping:
        raise BlobError(f"blob field {what} has unknown value {value}")
    return mapping[value]


def _read_blob(payload: bytes) -> BlobContents:
    root = fb.Blob.GetRootAs(payload, 0)
    part = _str(root.Part(), "part")
    inputs = _vector(root.InputsLength(), lambda i: _read_tensor(root.Inputs(i), f"inputs[{i}]", payload),
                     "inputs", payload)
    outputs = _vector(root.OutputsLength(), lambda i: _read_tensor(root.Outputs(i), f"outputs[{i}]", payload),
                      "outputs", payload)
    options = _read_options(root, payload)
    weights = _vector(root.WeightsLength(), lambda i: _read_weight(root.Weights(i), f"weights[{i}]", payload),
                      "weights", payload)
    kernels = _vector(root.KernelsLength(), lambda i: _read_kernel(root.Kernels(i), f"kernels[{i}]", payload),
                      "kernels", payload)
    engines = _vector(root.EnginesLength(), lambda i: _read_engine(root.Engines(i), f"engines[{i}]", payload),
                      "engines", payload)
    checks = _vector(root.ChecksLength(), lambda i: _read_check(root.Checks(i), f"checks[{i}]", payload),
                     "checks", payload)
    return BlobContents(
        part=part,
        inputs=inputs,
        outputs=outputs,
        options=options,
        onnx=_bytes(root, "Onnx", payload),
        kernels=kernels,
        engines=engines,
        producer=_read_producer(root.Producer()),
        weights=weights,
        data_file=_str(root.DataFile(), "data_file"),
        checks=checks,
    )


def _read_check(table: fb.Check, where: str, payload: bytes) -> CheckSpec:
    if table.Output() is None:
        raise BlobError(f"blob {where} has no output")
    check = CheckSpec(_read_tensor(table.Output(), f"{where}.output", payload),
                      _str(table.Message(), f"{where}.message"))
    try:
        _check_check(check, where)
    except BlobError as e:
        raise BlobError(f"blob {e}") from None
    return check


def _read_tensor(table: fb.TensorSpec, where: str, payload: bytes) -> TensorSpec:
    name = _str(table.Name(), f"{where}.name")
    dims = _vector(table.DimsLength(), lambda axis: _read_dim(table.Dims(axis), f"{where} '{name}' axis {axis}"),
                   f"{where}.dims", payload)
    return TensorSpec(name, _enum(table.Dtype(), _FB_TO_DTYPE, f"{where}.dtype"), dims)


def _read_dim(table: fb.Dim, where: str) -> DimSpec:
    size = table.Size()
    dim = DimSpec(None if size == -1 else size, _str(table.Name(), f"{where} name"),
                  table.Min(), table.Opt(), table.Max())
    try:
        _check_dim(dim, where)
    except BlobError as e:
        raise BlobError(f"blob {e}") from None
    return dim


def _read_options(root: fb.Blob, payload: bytes) -> CompileOptions:
    """The partition's CompileOptions: export_options with the build_options entries (a build option without one
    has its default)."""
    text = _str(root.ExportOptions(), "export_options")
    build = _read_build_options(root, payload)
    try:
        values = json.loads(text)
        if not isinstance(values, dict) or set(values) - set(EXPORT_ONLY_OPTIONS):
            raise OptionsError(f"export_options may hold only {', '.join(EXPORT_ONLY_OPTIONS)}")
        return parse_options({**values, **build})
    except (ValueError, OptionsError) as e:
        raise BlobError(f"blob options are not valid compile options: {e}") from None


def _read_build_options(root: fb.Blob, payload: bytes) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for i, entry in enumerate(_vector(root.BuildOptionsLength(), root.BuildOptions, "build_options", payload)):
        where = f"blob build_options[{i}]"
        name = _str(entry.Name(), f"{where}.name")
        if name not in BUILD_OPTIONS:
            raise BlobError(f"{where}: {name!r} is not a build option of this et-trt ({', '.join(BUILD_OPTIONS)}); "
                            "re-export the model with this et-trt version")
        if name in values:
            raise BlobError(f"{where}: {name!r} is set twice")
        value_type, value_table, kind = _OPTION_VALUES[BUILD_OPTIONS[name].kind]
        if entry.ValueType() != value_type:
            given = _OPTION_VALUE_NAMES.get(entry.ValueType(), "an unknown one")
            raise BlobError(f"{where}: {name!r} holds a value of type {given}; the option's type is {kind}")
        value = value_table.InitFromBuf(entry.Value().Bytes, entry.Value().Pos).value
        values[name] = _str(value, f"{where}.value") if value_type == fb.OptionValue.ChoiceValue else value
    return values


def _read_named_data(table: fb.NamedData | None, where: str, payload: bytes) -> NamedData:
    if table is None:
        raise BlobError(f"blob field {where} is missing")
    key = _str(table.Key(), f"{where}.key")
    digest = _bytes(table, "Sha256", payload)
    if not key.startswith(NAMED_DATA_PREFIX) or len(digest) != 32:
        raise BlobError(f"blob field {where}: key {key!r} must start with {NAMED_DATA_PREFIX!r} and sha256 be 32 "
                        f"bytes, got {len(digest)}")
    return NamedData(key, table.Size(), digest)


def _read_weight(table: fb.Weight, where: str, payload: bytes) -> WeightRecord:
    return WeightRecord(_str(table.Name(), f"{where}.name"), _read_named_data(table.Data(), f"{where}.data", payload))


def _read_engine(table: fb.Engine, where: str, payload: bytes) -> EngineRecord:
    return EngineRecord(
        plan=_read_named_data(table.Plan(), f"{where}.plan", payload),
        provider=_enum(table.Provider(), _FB_TO_PROVIDER, f"{where}.provider"),
        tensorrt_version=_str(table.TensorrtVersion(), f"{where}.tensorrt_version"),
        gpu_name=_str(table.GpuName(), f"{where}.gpu_name"),
        compute_capability=table.ComputeCapability(),
        options_not_applied=_vector(table.OptionsNotAppliedLength(),
                                    lambda i: _str(table.OptionsNotApplied(i), f"{where}.options_not_applied[{i}]"),
                                    f"{where}.options_not_applied", payload),
    )


def _read_kernel(table: fb.KernelImage, where: str, payload: bytes) -> KernelImage:
    # The reader's accessors are the object API's names, capitalized: NumWarps(), PtxVersion().
    values = {field: getattr(table, name[0].upper() + name[1:])() for field, name in KERNEL_IMAGE_SCHEMA_NAMES.items()}
    for field, value in values.items():
        if value is None or isinstance(value, bytes):  # a string (or the image table, read below)
            values[field] = _str(value, f"{where}.{field}")
    values["format"] = _enum(table.Format(), _FB_TO_IMAGE_FORMAT, f"{where}.format")
    values["dtype"] = _enum(table.Dtype(), _FB_TO_KERNEL_DTYPE, f"{where}.dtype")
    values["weight_format"] = _enum(table.WeightFormat(), _FB_TO_WEIGHT_FORMAT, f"{where}.weight_format")
    values["image"] = _read_named_data(table.Image(), f"{where}.image", payload)
    return KernelImage(**values)


def _read_producer(table: fb.Producer | None) -> dict[str, str | int]:
    if table is None:
        raise BlobError("blob lacks its producer record")
    return {
        "et_trt": _str(table.EtTrt(), "producer.et_trt"),
        "torch": _str(table.Torch(), "producer.torch"),
        "executorch": _str(table.Executorch(), "producer.executorch"),
        "onnx_opset": table.OnnxOpset(),
        "triton": _str(table.Triton(), "producer.triton"),
        "tensorrt": _str(table.Tensorrt(), "producer.tensorrt"),
    }
