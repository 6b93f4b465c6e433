"""The delegate blob: round trip, header layout, corruption refused, option mapping."""

import dataclasses
import hashlib
import json
import os
import random
import re
import struct
import zlib

import flatbuffers
import pytest
import torch

from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.options import (
    BUILD_OPTIONS,
    ENGINE_BUILD_POLICIES,
    FIELDS,
    KERNEL_ARCHS,
    PRECISIONS,
    PREFLIGHT_POLICIES,
    CompileOptions,
    ShapeRange,
)
from et_trt_backend.serialization import blob
from et_trt_backend.serialization import schema_generated as fb
from et_trt_backend.serialization.blob import (
    HEADER_SIZE,
    MAGIC,
    SCHEMA_VERSION,
    BlobContents,
    BlobError,
    CheckSpec,
    DimSpec,
    EngineRecord,
    TensorSpec,
    WeightRecord,
    deserialize,
    serialize,
)
from et_trt_backend.serialization.named_data import NamedData
from support.damaged_pte import reseal

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64, torch.bool, torch.bfloat16]


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def random_text(rng: random.Random, n: int = 12) -> str:
    # Non-ASCII on purpose: strings are UTF-8 in the schema.
    return "".join(rng.choice("abcxyz_019.:µé") for _ in range(rng.randint(1, n)))


def random_options(rng: random.Random) -> CompileOptions:
    return CompileOptions(
        precision=rng.choice(PRECISIONS),
        tf32=rng.random() < 0.5,
        shape_ranges={
            random_text(rng): ShapeRange(lo, lo + 1, lo + rng.randint(1, 9000))
            for lo in rng.sample(range(64), rng.randint(0, 3))
        },
        workspace_bytes=rng.choice([None, rng.randint(1, 1 << 40)]),
        optimization_level=rng.randint(0, 5),
        timing_cache=rng.choice([None, "/tmp/" + random_text(rng)]),
        kernel_archs=tuple(rng.sample(KERNEL_ARCHS, rng.randint(1, len(KERNEL_ARCHS)))),
        grouped_gemm_kernel=rng.random() < 0.5,
        engine_build=rng.choice(ENGINE_BUILD_POLICIES),
        preflight=rng.choice(PREFLIGHT_POLICIES),
    )


def random_tensor(rng: random.Random) -> TensorSpec:
    dims = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.5:
            size = rng.randint(0, 1 << 20)
            dims.append(DimSpec(size, "", size, size, size))
        else:
            lo = rng.randint(0, 100)
            dims.append(DimSpec(None, random_text(rng), lo, lo + rng.randint(0, 50), lo + rng.randint(50, 70000)))
    return TensorSpec(random_text(rng), rng.choice(DTYPES), dims)


def random_named_data(rng: random.Random, most: int = 5000) -> NamedData:
    return NamedData.of(rng.randbytes(rng.randint(1, most)))


def random_kernel(rng: random.Random) -> KernelImage:
    return KernelImage(
        kernel=random_text(rng), variant=random_text(rng), trans_b=rng.random() < 0.5, arch=rng.choice(KERNEL_ARCHS),
        format=rng.choice(["cubin", "ptx"]), image=random_named_data(rng, 3000), entry=random_text(rng),
        dtype=rng.choice(["bf16", "fp16"]),
        num_warps=rng.choice([4, 8]), shared_bytes=rng.randint(0, 232448), global_scratch_bytes=rng.randint(0, 512),
        global_scratch_align=rng.choice([1, 128]), profile_scratch_bytes=rng.randint(0, 64),
        block_m=rng.choice([64, 128]), block_n=rng.choice([64, 128, 256]), block_k=rng.choice([32, 64]),
        persistent=rng.random() < 0.5, ptx_version=rng.choice(["8.4", "8.8", "9.0"]),
        weight_format=rng.choice(["dense", "fp8"]), waits_for_prior_grid=rng.random() < 0.5,
    )


def random_engine(rng: random.Random) -> EngineRecord:
    if rng.random() < 0.5:
        return EngineRecord(random_named_data(rng), "tensorrt", "10." + str(rng.randint(0, 20)),
                            random_text(rng), rng.choice([80, 87, 90, 100, 110, 120]))
    return EngineRecord(random_named_data(rng), "tensorrt_rtx", "1." + str(rng.randint(0, 20)), "",
                        rng.choice([80, 86, 89, 120]), [random_text(rng) for _ in range(rng.randint(0, 2))])


def random_contents(rng: random.Random) -> BlobContents:
    engines = [random_engine(rng) for _ in range(rng.choice([0, 0, 1, 3]))]
    return BlobContents(
        part=random_text(rng),
        inputs=[random_tensor(rng) for _ in range(rng.randint(0, 4))],
        outputs=[random_tensor(rng) for _ in range(rng.randint(1, 3))],
        options=random_options(rng),
        onnx=rng.randbytes(rng.randint(0, 20000)),
        kernels=[random_kernel(rng) for _ in range(rng.randint(0, 3))],
        engines=engines,
        producer={"et_trt": "0.1.0", "torch": torch.__version__, "executorch": random_text(rng),
                  "onnx_opset": rng.randint(1, 30), "triton": random_text(rng),
                  "tensorrt": rng.choice(["", "10.13.0"])},
        weights=[WeightRecord(f"w{i}_{random_text(rng)}", random_named_data(rng)) for i in range(rng.randint(0, 4))],
        data_file=rng.choice(["", random_text(rng) + ".ptd"]),
        checks=[CheckSpec(TensorSpec(f"check{i}_{random_text(rng)}", torch.bool, []), random_text(rng, 80))
                for i in range(rng.choice([0, 0, 1, 2]))],
    )


def small_contents(seed: int) -> BlobContents:
    """Contents small enough to corrupt at every byte."""
    rng = random.Random(seed)
    contents = random_contents(rng)
    contents.onnx = rng.randbytes(200)
    contents.kernels = [dataclasses.replace(random_kernel(rng), image=NamedData.of(rng.randbytes(100)))]
    contents.engines = [EngineRecord(NamedData.of(rng.randbytes(100)), "tensorrt", "10.13.0", "NVIDIA H200", 90),
                        EngineRecord(NamedData.of(rng.randbytes(100)), "tensorrt_rtx", "1.7.1.116", "", 120,
                                     ["timing_cache: not read"])]
    contents.weights = [WeightRecord("w", NamedData.of(rng.randbytes(2000)))]
    contents.checks = [CheckSpec(TensorSpec("ok", torch.bool, []), "the mask selects another number of rows")]
    return contents


# ---- round trip ---------------------------------------------------------------
@pytest.mark.parametrize("trial", range(20))
def test_round_trip_of_random_contents(trial):
    seed = fresh_seed()
    contents = random_contents(random.Random(seed))
    data = serialize(contents)
    assert deserialize(data) == contents, f"seed {seed}"
    # Deterministic: the same contents give the same bytes (the content id is a cache key).
    assert serialize(deserialize(data)) == data, f"seed {seed}"


def test_round_trip_of_defaults_and_empty_fields():
    contents = BlobContents("", [], [], CompileOptions(), b"", [], [],
                            {key: kind() for key, kind in blob.PRODUCER_FIELDS.items()})
    assert deserialize(serialize(contents)) == contents


def test_kernel_weight_format_is_appended_and_old_images_read_dense():
    """weight_format is the table's last field, default Dense: a dense image is written without it (as a
    writer that predates the field wrote every image), a record made without it is dense, fp8 round-trips."""
    rng = random.Random(fresh_seed())
    dense = dataclasses.replace(random_kernel(rng), weight_format="dense")
    fp8 = dataclasses.replace(dense, weight_format="fp8")
    slot = 4 + 2 * 18  # vtable offset of field 18 (weight_format, the 19th)
    root = fb.Blob.GetRootAs(blob.kernel_images_flatbuffer([dense]), 0)
    assert root.Kernels(0)._tab.Offset(slot) == 0
    root = fb.Blob.GetRootAs(blob.kernel_images_flatbuffer([fp8]), 0)
    assert root.Kernels(0).WeightFormat() == fb.WeightFormat.Float8RowScaled
    fields = {f.name: getattr(dense, f.name) for f in dataclasses.fields(KernelImage) if f.name != "weight_format"}
    assert KernelImage(**fields).weight_format == "dense"
    contents = small_contents(fresh_seed())
    contents.kernels = [dense, fp8]
    assert [k.weight_format for k in deserialize(serialize(contents)).kernels] == ["dense", "fp8"]


def test_kernel_waits_for_prior_grid_is_appended_and_old_images_read_false():
    """waits_for_prior_grid follows weight_format, default false: an image of a writer that predates it (the field
    absent) is launched without the overlap, a record made without it is false, true round-trips."""
    rng = random.Random(fresh_seed())
    waits = dataclasses.replace(random_kernel(rng), waits_for_prior_grid=True)
    plain = dataclasses.replace(waits, waits_for_prior_grid=False)
    slot = 4 + 2 * 19  # vtable offset of field 19 (waits_for_prior_grid, the 20th)
    assert fb.Blob.GetRootAs(blob.kernel_images_flatbuffer([plain]), 0).Kernels(0)._tab.Offset(slot) == 0
    assert fb.Blob.GetRootAs(blob.kernel_images_flatbuffer([waits]), 0).Kernels(0).WaitsForPriorGrid()
    fields = {f.name: getattr(waits, f.name) for f in dataclasses.fields(KernelImage)
              if f.name != "waits_for_prior_grid"}
    assert not KernelImage(**fields).waits_for_prior_grid
    contents = small_contents(fresh_seed())
    contents.kernels = [waits, plain]
    assert [k.waits_for_prior_grid for k in deserialize(serialize(contents)).kernels] == [True, False]


def test_producer_versions_name_this_build():
    producer = blob.producer_versions(18, triton="3.9.0")
    assert producer["torch"] == torch.__version__ and producer["onnx_opset"] == 18
    assert producer["triton"] == "3.9.0" and producer["tensorrt"] == ""
    contents = small_contents(fresh_seed())
    contents.producer = producer
    assert deserialize(serialize(contents)).producer == producer


def test_header_layout_is_the_documented_one():
    contents = small_contents(fresh_seed())
    data = serialize(contents)
    payload = data[HEADER_SIZE:]
    assert HEADER_SIZE == 56
    assert data[0:8] == MAGIC == b"ETTRTBLB"
    assert struct.unpack_from("<I", data, 8)[0] == SCHEMA_VERSION == 4
    assert struct.unpack_from("<I", data, 12)[0] == zlib.crc32(data[16:])
    assert struct.unpack_from("<Q", data, 16)[0] == len(payload)
    assert data[24:56] == hashlib.sha256(payload).digest()
    assert payload[4:8] == b"ETRT"  # flatbuffer file identifier
    header = blob.read_header(data)
    assert header.content_id == hashlib.sha256(payload).hexdigest()
    # The payload is a flatbuffer the generated accessors read directly.
    root = fb.Blob.GetRootAs(payload, 0)
    assert root.Part().decode() == contents.part
    assert root.OnnxAsNumpy().tobytes() == contents.onnx


def _build_option_entries(data: bytes) -> dict[str, tuple[int, object]]:
    """{name: (union value type, value)} of a blob's build_options entries, read with flatc's object API."""
    root = fb.BlobT.InitFromObj(fb.Blob.GetRootAs(data[HEADER_SIZE:], 0))
    values = {entry.name.decode(): (entry.valueType, entry.value.value) for entry in root.buildOptions}
    return {name: (kind, value.decode() if isinstance(value, bytes) else value)  # a choice's name
            for name, (kind, value) in values.items()}


def test_build_options_entries_carry_the_options():
    value_types = {bool: fb.OptionValue.BoolValue, int: fb.OptionValue.IntValue, str: fb.OptionValue.ChoiceValue}
    for _ in range(10):
        seed = fresh_seed()
        options = random_options(random.Random(seed))
        contents = small_contents(seed)
        contents.options = options
        data = serialize(contents)
        # One typed entry per build option that is set; one left at None (workspace_bytes) has none.
        assert _build_option_entries(data) == {
            name: (value_types[spec.kind], getattr(options, name))
            for name, spec in BUILD_OPTIONS.items() if getattr(options, name) is not None}
        # Every other option once, in export_options.
        root = fb.Blob.GetRootAs(data[HEADER_SIZE:], 0)
        assert json.loads(root.ExportOptions()) == {k: v for k, v in options.to_json().items()
                                                    if k not in BUILD_OPTIONS}


def _with_build_options(data: bytes, entries: list[tuple[str, int, object]]) -> bytes:
    """The blob with its build_options entries replaced by (name, union value type, value) ones, resealed."""
    root = fb.BlobT.InitFromObj(fb.Blob.GetRootAs(data[HEADER_SIZE:], 0))
    tables = {fb.OptionValue.BoolValue: fb.BoolValueT, fb.OptionValue.IntValue: fb.IntValueT,
              fb.OptionValue.ChoiceValue: fb.ChoiceValueT}
    root.buildOptions = []
    for name, value_type, value in entries:
        entry = fb.BuildOptionT()
        entry.name, entry.valueType, entry.value = name, value_type, tables[value_type]()
        entry.value.value = value
        root.buildOptions.append(entry)
    builder = flatbuffers.Builder(len(data))
    builder.Finish(root.Pack(builder), file_identifier=blob.FILE_IDENTIFIER)
    return reseal(data[:HEADER_SIZE] + bytes(builder.Output()))


@pytest.mark.parametrize("entries, error", [
    ([("tactic_sources", fb.OptionValue.IntValue, 1)],
     r"build_options\[0\]: 'tactic_sources' is not a build option of this et-trt \(tf32, .*\); re-export"),
    ([("optimization_level", fb.OptionValue.ChoiceValue, "5")],
     "'optimization_level' holds a value of type ChoiceValue; the option's type is int"),
    ([("tf32", fb.OptionValue.BoolValue, True), ("tf32", fb.OptionValue.BoolValue, False)],
     r"build_options\[1\]: 'tf32' is set twice"),
    ([("optimization_level", fb.OptionValue.IntValue, 6)], "option 'optimization_level': must be an integer 0-5"),
    ([("workspace_bytes", fb.OptionValue.IntValue, 0)], "option 'workspace_bytes': size must be positive"),
])
def test_foreign_build_options_are_refused(entries, error):
    data = serialize(small_contents(fresh_seed()))
    with pytest.raises(BlobError, match=error):
        deserialize(_with_build_options(data, entries))


def test_a_build_option_without_an_entry_has_its_default():
    contents = small_contents(fresh_seed())
    contents.options = dataclasses.replace(contents.options, tf32=False, optimization_level=1)
    data = _with_build_options(serialize(contents), [("optimization_level", fb.OptionValue.IntValue, 4)])
    options = deserialize(data).options
    assert (options.tf32, options.optimization_level) == (CompileOptions.tf32, 4)


def test_every_option_is_mapped_or_declared_export_only():
    build, export_only = set(BUILD_OPTIONS), set(blob.EXPORT_ONLY_OPTIONS)
    assert not build & export_only
    undecided = set(FIELDS) - build - export_only
    assert not undecided, (
        f"CompileOptions field(s) {sorted(undecided)} are neither build options nor declared export-only: "
        "declare them with options.build_option, or add them to EXPORT_ONLY_OPTIONS with the reason"
    )
    assert not export_only - set(FIELDS), "blob.py names options that no longer exist"


# ---- corruption -----------------------------------------------------------------
def test_every_single_bit_flip_is_refused():
    seed = fresh_seed()
    data = serialize(small_contents(seed))
    rng = random.Random(seed)
    for offset in range(len(data)):
        corrupt = bytearray(data)
        corrupt[offset] ^= 1 << rng.randrange(8)
        with pytest.raises(BlobError):
            deserialize(bytes(corrupt))


def test_truncation_and_extension_are_refused():
    data = serialize(small_contents(fresh_seed()))
    for size in range(len(data)):
        with pytest.raises(BlobError):
            deserialize(data[:size])
    for extra in (b"\0", b"\0" * 8, os.urandom(1000)):
        with pytest.raises(BlobError, match="truncated or extended"):
            deserialize(data + extra)


def test_errors_name_the_problem():
    data = serialize(small_contents(fresh_seed()))
    with pytest.raises(BlobError, match="magic"):
        deserialize(b"XXXXXXXX" + data[8:])
    for other in (SCHEMA_VERSION - 1, SCHEMA_VERSION + 1):  # an older export (weights inside), a newer one
        with pytest.raises(BlobError, match=f"blob schema version {other}, this reader reads version "
                                            f"{SCHEMA_VERSION}; re-export"):
            deserialize(data[:8] + struct.pack("<I", other) + data[12:])
    with pytest.raises(BlobError, match="crc32"):
        deserialize(data[:-1] + bytes([data[-1] ^ 0x80]))
    with pytest.raises(BlobError, match="sha256"):
        payload = bytearray(data[HEADER_SIZE:])
        payload[-1] ^= 1
        forged = data[:HEADER_SIZE] + bytes(payload)
        deserialize(forged[:12] + struct.pack("<I", zlib.crc32(forged[16:])) + forged[16:])
    with pytest.raises(BlobError, match="identifier"):
        payload = bytearray(data[HEADER_SIZE:])
        payload[4:8] = b"XXXX"
        deserialize(reseal(data[:HEADER_SIZE] + bytes(payload)))


def test_malformed_flatbuffer_with_valid_checksums_gives_only_blob_errors():
    # Checksums are not a verifier: a payload from a buggy writer must still
    # be refused with BlobError (or read as some valid contents), never crash.
    seed = fresh_seed()
    rng = random.Random(seed)
    data = serialize(small_contents(seed))
    refused = 0
    for _ in range(600):
        payload = bytearray(data[HEADER_SIZE:])
        for _ in range(rng.randint(1, 4)):
            offset = rng.randrange(8, len(payload))  # keep root offset and identifier
            payload[offset] = rng.randrange(256)
        try:
            contents = deserialize(reseal(data[:HEADER_SIZE] + bytes(payload)))
        except BlobError:
            refused += 1
        else:
            assert isinstance(contents, BlobContents)
    assert refused > 0, f"seed {seed}"


# ---- bad contents are refused at write time --------------------------------------
def test_serialize_refuses_bad_contents():
    contents = small_contents(fresh_seed())
    with pytest.raises(BlobError, match="static size 4 needs min = opt = max"):
        serialize(dataclasses.replace(contents, inputs=[TensorSpec("x", torch.float32, [DimSpec(4, "", 0, 4, 4)])]))
    with pytest.raises(BlobError, match="dynamic range"):
        serialize(dataclasses.replace(contents, inputs=[TensorSpec("x", torch.float32, [DimSpec(None, "t", 5, 2, 9)])]))
    with pytest.raises(BlobError, match="dtype"):
        serialize(dataclasses.replace(contents, outputs=[TensorSpec("y", torch.complex64, [])]))
    with pytest.raises(BlobError, match="no name"):
        serialize(dataclasses.replace(contents, outputs=[TensorSpec("", torch.float32, [])]))
    with pytest.raises(BlobError, match="producer key 'gpu'"):
        serialize(dataclasses.replace(contents, producer={"gpu": "x"}))
    with pytest.raises(BlobError, match="onnx_opset"):
        serialize(dataclasses.replace(contents, producer={"onnx_opset": "18"}))
    bad_kernel = dataclasses.replace(contents.kernels[0], format="fatbin")
    with pytest.raises(BlobError, match="format"):
        serialize(dataclasses.replace(contents, kernels=[bad_kernel]))
    bad_kernel = dataclasses.replace(contents.kernels[0], weight_format="int3")
    with pytest.raises(BlobError, match="weight_format must be one of dense, fp8, int4, got 'int3'"):
        serialize(dataclasses.replace(contents, kernels=[bad_kernel]))

    with pytest.raises(BlobError, match="a check's output is a bool scalar, not torch.float32 of 0 dimension"):
        serialize(dataclasses.replace(contents, checks=[CheckSpec(TensorSpec("ok", torch.float32, []), "m")]))
    with pytest.raises(BlobError, match="a check's output is a bool scalar, not torch.bool of 1 dimension"):
        serialize(dataclasses.replace(contents, checks=[CheckSpec(TensorSpec("ok", torch.bool, [
            DimSpec(2, "", 2, 2, 2)]), "m")]))
    with pytest.raises(BlobError, match="'ok' has no message"):
        serialize(dataclasses.replace(contents, checks=[CheckSpec(TensorSpec("ok", torch.bool, []), "")]))

    bad_engine = dataclasses.replace(contents.engines[0], provider="onnxruntime")
    with pytest.raises(BlobError, match="engine provider 'onnxruntime' is not one of tensorrt, tensorrt_rtx"):
        serialize(dataclasses.replace(contents, engines=[bad_engine]))
    with pytest.raises(BlobError, match="empty plan"):
        serialize(dataclasses.replace(contents, engines=[dataclasses.replace(contents.engines[0], plan=NamedData.of(b""))]))
