"""The et-trt blobs inside a .pte, found with ExecuTorch's own program deserializer."""

from __future__ import annotations

import dataclasses
import re

from executorch.exir._serialize._program import _ExtendedHeader, deserialize_pte_binary
from executorch.exir.schema import DataLocation

from et_trt_backend import BACKEND_ID
from et_trt_backend.serialization import blob


class PteError(ValueError):
    """The file is not a readable ExecuTorch program."""


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


def _check_framing(pte: bytes) -> None:
    """The checks a .pte's first bytes allow, with a message a user can act on: the
    flatbuffer identifier ("ET" + schema version) and, where the extended header is
    present, that the file holds the program and segments it announces."""
    if len(pte) < 8 or not re.fullmatch(rb"ET\d\d", pte[4:8]):
        raise PteError(f"not an ExecuTorch program: {len(pte)} bytes without the 'ET..' identifier at byte 4 "
                       "that every .pte has; export it with to_executorch() or `et-trt export`")
    header = _ExtendedHeader.from_bytes(pte[8:]) if len(pte) >= 8 + _ExtendedHeader.EXPECTED_LENGTH else None
    if header is not None and header.is_valid():
        needed = max(header.program_size, header.segment_base_offset + header.segment_data_size)
        if needed > len(pte):
            raise PteError(f"truncated or corrupted ExecuTorch program: its header announces {needed} bytes, the file has "
                           f"{len(pte)}; copy or export it again")


def read_delegates(pte: bytes) -> list[Delegate]:
    """Every delegate of every execution plan, with its processed bytes."""
    _check_framing(pte)
    try:
        program = deserialize_pte_binary(pte).program
    except Exception as e:  # the deserializer raises many kinds on foreign bytes
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PteError(f"corrupted ExecuTorch program: its flatbuffer does not parse ({detail})") from e
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


def read_partitions(pte: bytes) -> list[Partition]:
    """The TensorRT partitions of a .pte; BlobError names the partition whose blob is bad."""
    partitions = []
    for delegate in read_delegates(pte):
        if delegate.backend_id != BACKEND_ID:
            continue
        try:
            partitions.append(Partition(delegate, blob.read_header(delegate.data), blob.deserialize(delegate.data)))
        except blob.BlobError as e:
            raise blob.BlobError(f"plan '{delegate.plan}' delegate {delegate.index}: {e}") from e
    return partitions
