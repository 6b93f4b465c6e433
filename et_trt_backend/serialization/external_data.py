"""A partition's weights and engines as ExecuTorch named data.

At export, `move_weights_out` (run by the lowering on the ONNX exporter's IR,
before any protobuf holds the weights) turns every initializer of
MIN_EXTERNAL_BYTES or more into ONNX external data at location = its
named-data key, its bytes written once to a file and never copied in memory;
`store_output` hands each distinct NamedData to ExecuTorch's NamedDataStore.
ExecuTorch places it in the .pte's data segment, or in `<tag>.ptd` where the
program's weights carry ExecuTorch's `delegate_constant_tag`
(exir.passes.external_constants_pass; `tag_weights`, `external_tag`).

Reading (inspect, check, tests): `attach` fills each NamedData of a blob from
the program's named data, checking size and sha256 (`missing_data` says why
some is missing); `onnx_with_weights` gives
the ONNX with its initializers inline again (onnxruntime, trtexec dumps).
"""

from __future__ import annotations

import hashlib
import pathlib
import tempfile
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import torch
from executorch.exir._serialize._cord import FileBackedData
from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput

from et_trt_backend.serialization.blob import BlobContents, BlobError, WeightRecord
from et_trt_backend.serialization.named_data import NAMED_DATA_PREFIX, NamedData

# Smaller initializers (shapes, scalars, norms' epsilons) stay in the ONNX, where the
# parser and the pre-flight rules read their values. ONNX's own external-data helper
# uses the same threshold.
MIN_EXTERNAL_BYTES = 1024
# Alignment of each named-data buffer in the .pte or .ptd (TensorRT reads the
# weights in place: any element type is aligned).
ALIGNMENT = 64
# The node.meta["custom"] key ExecuTorch's delegate_external_constants_pass sets on weights.
CONSTANT_TAG_META = "delegate_constant_tag"

# This process's weight files: <folder>/<key>, one NamedData each (alive while someone holds it;
# the file goes with it).
_folder: tempfile.TemporaryDirectory | None = None
_weight_files: weakref.WeakValueDictionary[str, NamedData] = weakref.WeakValueDictionary()


def move_weights_out(model: ir.Model) -> list[WeightRecord]:
    """Turns each initializer of MIN_EXTERNAL_BYTES or more of the ONNX exporter's `model` into external
    data at location = its key, its bytes written to a file straight from the tensor (no copy in memory);
    returns them, in initializer order, as file-backed NamedData."""
    global _folder
    if _folder is None:
        _folder = tempfile.TemporaryDirectory(prefix="et_trt_weights_")
    folder = pathlib.Path(_folder.name)
    weights = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.nbytes < MIN_EXTERNAL_BYTES:
            continue
        raw = memoryview(np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8))
        digest = hashlib.sha256(raw).digest()
        key = NAMED_DATA_PREFIX + digest.hex()
        data = _weight_files.get(key)
        if data is None:
            path = folder / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(raw)
            data = _weight_files[key] = NamedData.in_file(path, digest)
        value.const_value = ir.ExternalTensor(key, 0, data.size, tensor.dtype, shape=tensor.shape, name=value.name,
                                              base_dir=folder)
        weights.append(WeightRecord(value.name, data))
    return weights


def external_tag(program: torch.export.ExportedProgram, part: str) -> str | None:
    """The tag ExecuTorch's delegate_external_constants_pass put on the partition's weights: their
    named data goes to `<tag>.ptd`. None: it stays in the .pte."""
    tags = {node.meta.get("custom", {}).get(CONSTANT_TAG_META) for node in program.graph.nodes
            if node.op == "placeholder"} - {None}
    if len(tags) > 1:
        raise BlobError(f"part {part!r}: its weights carry several external data tags ({', '.join(sorted(tags))}); "
                        "et-trt keeps a partition's weights in one file: give them one tag")
    return next(iter(tags), None)


def tag_weights(program: torch.export.ExportedProgram, tag: str) -> None:
    """Tags every weight of `program` (parameters, buffers, constants) for `<tag>.ptd`, as ExecuTorch's
    delegate_external_constants_pass_unlifted does on an unlifted module before torch.export."""
    signature = program.graph_signature
    weights = {*signature.inputs_to_parameters, *signature.inputs_to_buffers,
               *signature.inputs_to_lifted_tensor_constants}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in weights:
            node.meta.setdefault("custom", {})[CONSTANT_TAG_META] = tag


def store_output(contents: BlobContents, tag: str | None) -> NamedDataStoreOutput:
    """The named data of a blob made at export (data attached), each key once, for PreprocessResult."""
    store = NamedDataStore()
    for data in contents.named_data():
        store.add_named_data(data.key, data.payload(), alignment=ALIGNMENT, external_tag=tag)
    return store.get_named_data_store_output()


def store_lookup(output: NamedDataStoreOutput) -> dict[str, bytes]:
    """key -> bytes of a NamedDataStoreOutput, in the .pte and in every .ptd."""
    entries = dict(output.pte_data)
    for tagged in output.external_data.values():
        entries.update(tagged)
    return {key: _as_bytes(output.buffers[entry.buffer_index]) for key, entry in entries.items()}


def _as_bytes(buffer: bytes | FileBackedData) -> bytes:
    return buffer.to_bytes() if isinstance(buffer, FileBackedData) else bytes(buffer)


def missing_data(contents: BlobContents, lookup: Mapping[str, bytes], data_files: Sequence[str]) -> str | None:
    """Why named data of `contents` is not in `lookup` (read from the .pte and the data files named
    `data_files`), in a few words that say what to do; None if all of it is there."""
    keys = [data.key for data in contents.named_data()]
    present = sum(key in lookup for key in keys)
    if present == len(keys):
        return None
    home = contents.data_file
    if not home:
        return "the blob says the .pte holds it: the .pte is damaged or was rewritten; export it again"
    if data_files and any(key.startswith(NAMED_DATA_PREFIX) for key in lookup):
        # Kernel images are keyed by content: another export may share some of them.
        return (f"{' and '.join(data_files)} is from another export, or damaged: it holds {present} of this part's "
                f"{len(keys)} named data; pass the {home} exported with this .pte")
    return f"pass --data {home}"


def attach(contents: BlobContents, lookup: Mapping[str, bytes], source: str, data_files: Sequence[str] = ()) -> None:
    """Fills each NamedData of `contents` from `lookup` (the program's named data; `source` says where
    it was read from, `data_files` names the data files among it). BlobError, naming the key and the file it
    belongs in, where one is missing (saying why: no data file, or one of another export) or does not match
    its size and sha256."""
    home = f"'{contents.data_file}'" if contents.data_file else "the .pte"
    for data in contents.named_data():
        found = lookup.get(data.key)
        if found is None:
            named = f"part {contents.part!r}: named data {data.key} ({data.size} bytes) is not in {source}"
            if contents.data_file and not data_files:
                raise BlobError(f"{named}; it was exported to {home}: give the program its data file")
            raise BlobError(f"{named}: {missing_data(contents, lookup, data_files)}")
        if len(found) != data.size or hashlib.sha256(found).digest() != data.sha256:
            raise BlobError(f"part {contents.part!r}: named data {data.key} in {source} does not match the blob "
                            f"({len(found)} bytes, expected {data.size} with sha256 {data.sha256.hex()[:16]}...): "
                            f"corrupted, or {home} is from another export")
        data.data = found


def onnx_with_weights(onnx_model: bytes, weights: Sequence[WeightRecord]) -> onnx.ModelProto:
    """The ONNX model with its external initializers inline again (their data attached)."""
    model = onnx.load_from_string(onnx_model)
    by_name = {weight.name: weight.data for weight in weights}
    for tensor in model.graph.initializer:
        if tensor.name in by_name:
            tensor.raw_data = by_name[tensor.name].bytes()
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return model
