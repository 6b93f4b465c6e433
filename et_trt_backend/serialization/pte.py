"""The et-trt blobs inside a .pte, and their named data in it or in .ptd files, found with
ExecuTorch's own program and data-file deserializers."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import subprocess
from collections.abc import Sequence

from executorch.exir._serialize._cord import Cord
from executorch.exir._serialize._program import PTEFile, _ExtendedHeader, deserialize_pte_binary
from executorch.exir.schema import DataLocation, DelegateCall, KernelCall
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorHeader, FlatTensorSerializer

from et_trt_backend import BACKEND_ID
from et_trt_backend.serialization import blob, external_data
from et_trt_backend.serialization.pte_header import PteError, check_identifier


@dataclasses.dataclass
class Delegate:
    plan: str  # execution plan (method) name, e.g. "forward"
    index: int  # delegate index within the plan
    backend_id: str
    compile_specs: dict[str, bytes]
    data: bytes  # the backend's processed bytes


@dataclasses.dataclass
class Partition:
    """One TensorRT delegate of a .pte: its blob, verified and read."""

    delegate: Delegate
    header: blob.BlobHeader
    contents: blob.BlobContents
    missing_data: str | None = None  # why its named data is not attached (read_partitions' missing_data_ok)


def _check_framing(pte: bytes) -> None:
    """The checks a .pte's first bytes allow, with a message a user can act on: the
    flatbuffer identifier ("ET" + schema version) and, where the extended header is
    present, that the file holds the program and segments it announces."""
    check_identifier(pte)
    header = _ExtendedHeader.from_bytes(pte[8:]) if len(pte) >= 8 + _ExtendedHeader.EXPECTED_LENGTH else None
    if header is not None and header.is_valid():
        needed = max(header.program_size, header.segment_base_offset + header.segment_data_size)
        if needed > len(pte):
            raise PteError(f"truncated or corrupted ExecuTorch program: its header announces {needed} bytes, the file has "
                           f"{len(pte)}; copy or export it again")


def _load(pte: bytes) -> PTEFile:
    _check_framing(pte)
    try:
        return deserialize_pte_binary(pte)
    except Exception as e:  # the deserializer raises many kinds on foreign bytes
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PteError(f"corrupted ExecuTorch program: its flatbuffer does not parse ({detail})") from e


def _delegates(pte_file: PTEFile) -> list[Delegate]:
    program = pte_file.program
    delegates = []
    for plan in program.execution_plan:
        for index, delegate in enumerate(plan.delegates):
            # deserialize_pte_binary moves segment data inline.
            if delegate.processed.location != DataLocation.INLINE:
                raise PteError(f"plan '{plan.name}' delegate {index}: processed data is not inline after loading")
            data = program.backend_delegate_data[delegate.processed.index].data
            specs = {spec.key: bytes(spec.value) for spec in delegate.compile_specs}
            delegates.append(Delegate(plan.name, index, delegate.id, specs, bytes(data)))
    return delegates


def read_delegates(pte: bytes) -> list[Delegate]:
    """Every delegate of every execution plan, with its processed bytes."""
    return _delegates(_load(pte))


@dataclasses.dataclass
class Plan:
    """One execution plan (method) of a .pte: its delegate calls, and the operators it calls outside them."""

    name: str
    delegate_calls: int
    kernel_calls: collections.Counter  # "aten::constant_pad_nd.out" -> calls: ExecuTorch's kernels


def read_plans(pte: bytes) -> list[Plan]:
    """Every execution plan of the .pte, with what its instructions call."""
    plans = []
    for plan in _load(pte).program.execution_plan:
        calls = [instruction.instr_args for chain in plan.chains for instruction in chain.instructions]
        kernels = collections.Counter(
            f"{plan.operators[c.op_index].name}.{plan.operators[c.op_index].overload}".rstrip(".")
            for c in calls if isinstance(c, KernelCall))
        plans.append(Plan(plan.name, sum(isinstance(c, DelegateCall) for c in calls), kernels))
    return plans


def _data_file_problem(data: bytes) -> str | None:
    """What is wrong with the framing of a data file's bytes (its header and where it puts the flatbuffer and the
    data), as the runtime's et_trt::verify_data_file says it; None if nothing is. ExecuTorch's deserializer hands
    the flatbuffer to flatc, which crashes on some damaged ones."""
    if len(data) < 64:
        return f"{len(data)} bytes, too short for an ExecuTorch data file (.ptd), which starts with a 64-byte header"
    if re.fullmatch(rb"ET\d\d", data[4:8]):
        return "an ExecuTorch program (.pte), not a data file (.ptd): pass the .ptd exported with it"
    header = FlatTensorHeader.from_bytes(data[8:])
    if data[4:8] != b"FT01" or header.magic != FlatTensorHeader.EXPECTED_MAGIC:
        return "not an ExecuTorch data file (.ptd): no 'FT01' identifier and 'FH01' header at bytes 4-12"
    if header.length < FlatTensorHeader.EXPECTED_LENGTH:
        return (f"its header is {header.length} bytes long, less than the {FlatTensorHeader.EXPECTED_LENGTH} it "
                "must hold")
    if header.flatbuffer_offset + header.flatbuffer_size > len(data):
        return (f"its header announces a flatbuffer of {header.flatbuffer_size} bytes at offset "
                f"{header.flatbuffer_offset}, past the file's end ({len(data)} bytes): truncated?")
    if header.segment_base_offset + header.segment_data_size > len(data):
        return (f"its header announces {header.segment_data_size} bytes of data at offset "
                f"{header.segment_base_offset}, past the file's end ({len(data)} bytes): truncated?")
    return None


def read_data_file(path: str | os.PathLike) -> dict[str, bytes]:
    """key -> bytes of an ExecuTorch data file (.ptd); PteError (one line naming the file and what is wrong) if it
    is not one."""
    fix = "; copy the file again or re-export it (et-trt export --external-data)"
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise PteError(f"{path}: cannot read the data file ({e.strerror})") from e
    problem = _data_file_problem(data)
    if problem is not None:
        raise PteError(f"{path}: {problem}{fix}")
    try:
        payload = FlatTensorSerializer().deserialize(Cord(data))
        named = {key: bytes(payload.buffers[entry.buffer_index]) for key, entry in payload.named_data.items()}
    except subprocess.CalledProcessError as e:  # flatc fails (or crashes) on a damaged flatbuffer
        raise PteError(f"{path}: its flatbuffer (the key table) does not parse{fix}") from e
    except Exception as e:  # the deserializer raises many kinds on what flatc did read
        detail = str(e).splitlines()[0][:200] if str(e) else ""
        raise PteError(f"{path}: its flatbuffer (the key table) does not read back ({type(e).__name__}"
                       f"{': ' + detail if detail else ''}){fix}") from e
    return named


def read_partitions(pte: bytes, data_files: Sequence[str | os.PathLike] = (), data_dir: str | os.PathLike | None = None,
                    missing_data_ok: bool = False) -> list[Partition]:
    """The TensorRT partitions of a .pte, their named data attached from the .pte and the `data_files`
    (.ptd; none given: those the partitions name that exist in `data_dir`). BlobError names the partition
    whose blob or named data is bad. `missing_data_ok`: a partition whose named data is not found is
    returned unattached (its NamedData.data None, its missing_data saying why)."""
    pte_file = _load(pte)
    partitions = []
    for delegate in _delegates(pte_file):
        if delegate.backend_id == BACKEND_ID:
            with _naming(delegate):
                partitions.append(Partition(delegate, blob.read_header(delegate.data), blob.deserialize(delegate.data)))
    if not data_files and data_dir is not None:
        named = sorted({p.contents.data_file for p in partitions} - {""})
        data_files = [path for path in (os.path.join(data_dir, name) for name in named) if os.path.isfile(path)]
    lookup = external_data.store_lookup(pte_file.named_data) if pte_file.named_data is not None else {}
    for path in data_files:
        lookup.update(read_data_file(path))
    names = [os.path.basename(path) for path in data_files]
    source = "the .pte" + "".join(f" or {name}" for name in names)
    for partition in partitions:
        contents = partition.contents
        missing = external_data.missing_data(contents, lookup, names)
        if missing_data_ok and missing is not None:
            partition.missing_data = missing
            continue
        with _naming(partition.delegate):
            external_data.attach(contents, lookup, source, names)
    return partitions


@contextlib.contextmanager
def _naming(delegate: Delegate):
    """BlobErrors raised inside name the delegate."""
    try:
        yield
    except blob.BlobError as e:
        raise blob.BlobError(f"plan '{delegate.plan}' delegate {delegate.index}: {e}") from e
