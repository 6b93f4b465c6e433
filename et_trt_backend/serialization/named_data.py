"""Bytes an et-trt blob names instead of holding (schema.fbs, table NamedData): a partition's
weights, kernel images and engines, which ExecuTorch keeps as named data in the .pte's data
segment or in a .ptd file (serialization/external_data.py). A leaf module: kernels/ and
serialization/ both use it, and it needs no ExecuTorch until bytes are put in a file (the
device benchmarks read kernel images with torch alone)."""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executorch.exir._serialize._cord import FileBackedData

# Named-data keys: this prefix and the hex sha256 of the bytes.
NAMED_DATA_PREFIX = "et_trt/"


class NamedDataMissing(ValueError):
    """The bytes of a NamedData were asked for but not attached."""


@dataclasses.dataclass(unsafe_hash=True)  # hashed and compared by key, size and digest, never by the bytes
class NamedData:
    """Bytes a blob names instead of holding. `data` is the bytes where known: in memory, or in a file
    (ExecuTorch's FileBackedData: a partition's weights at export, so that they are never copied into
    memory), or attached from the program's named data (external_data.attach)."""

    key: str
    size: int
    sha256: bytes
    data: "bytes | FileBackedData | None" = dataclasses.field(default=None, repr=False, compare=False)
    file: pathlib.Path | None = dataclasses.field(default=None, repr=False, compare=False)  # set: `data` lies there
    _view: memoryview | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, data: bytes) -> "NamedData":
        digest = hashlib.sha256(data).digest()
        return cls(NAMED_DATA_PREFIX + digest.hex(), len(data), digest, data)

    @classmethod
    def in_file(cls, path: pathlib.Path, sha256: bytes) -> "NamedData":
        """The bytes of `path`, whose digest is `sha256`; the file is removed when this is collected."""
        from executorch.exir._serialize._cord import FileBackedData

        data = FileBackedData(str(path), cleanup=True, sha256=sha256)
        return cls(NAMED_DATA_PREFIX + sha256.hex(), len(data), sha256, data, path)

    def payload(self) -> "bytes | FileBackedData":
        """The bytes as held: bytes, or the FileBackedData of a file (as ExecuTorch's NamedDataStore takes them)."""
        if self.data is None:
            raise NamedDataMissing(f"named data {self.key} ({self.size} bytes) is not attached: read the program "
                                   "with its named data (et_trt_backend.serialization.pte.read_partitions)")
        return self.data

    def bytes(self) -> bytes:
        """The bytes, as one bytes object (read from the file where file-backed)."""
        data = self.payload()
        return data.to_bytes() if self.file is not None else data

    def view(self) -> memoryview:
        """The bytes without a copy (a read-only memory map where file-backed); valid while this lives."""
        data = self.payload()
        if self.file is None:
            return memoryview(data)
        if self._view is None:
            with open(self.file, "rb") as f:
                self._view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        return self._view
