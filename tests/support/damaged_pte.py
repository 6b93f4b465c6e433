"""Damaged .pte files and blobs, made from good ones, for the tools that must refuse them in one clear line."""

from __future__ import annotations

import hashlib
import random
import struct
import zlib

from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

from et_trt_backend import BACKEND_ID
from et_trt_backend.serialization import blob
from et_trt_backend.serialization.blob import HEADER_SIZE
from et_trt_backend.serialization.pte import read_delegates

KINDS = ("empty", "random", "truncated", "garbage_after_identifier", "flipped_header")


def blobs(pte: bytes) -> list[bytes]:
    """The et-trt delegate blobs of a .pte, in program order (to find and damage them in place)."""
    return [d.data for d in read_delegates(pte) if d.backend_id == BACKEND_ID]


def damaged(good: bytes, kind: str, seed: int) -> bytes:
    """`good` damaged as `kind` (one of KINDS), with fresh random bytes from `seed`."""
    rng = random.Random(seed)
    if kind == "empty":
        return b""
    if kind == "random":
        return rng.randbytes(rng.randint(8, 5000))
    if kind == "truncated":
        return good[: rng.randint(64, len(good) - 1)]
    if kind == "garbage_after_identifier":  # a valid "ET12" identifier, nothing valid after it
        return good[:8] + rng.randbytes(rng.randint(100, 5000))
    if kind == "flipped_header":  # the extended header's sizes scrambled
        data = bytearray(good)
        for i in range(16, 40):
            data[i] ^= rng.randint(1, 255)
        return bytes(data)
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


def rewrite_blob(pte: bytes, change, named_data: bool = True) -> bytes:
    """The .pte with its first TensorRT blob replaced by change(blob bytes), through ExecuTorch's serializer;
    without its named data if not `named_data`."""
    pte_file = deserialize_pte_binary(pte)
    if not named_data:
        pte_file.named_data = None
    program = pte_file.program
    delegate = next(d for d in program.execution_plan[0].delegates if d.id == BACKEND_ID)
    entry = program.backend_delegate_data[delegate.processed.index]
    entry.data = change(entry.data)
    return bytes(serialize_pte_binary(pte_file))


def reseal(data: bytes) -> bytes:
    """The blob with its header recomputed, so corruption reaches the flatbuffer reader."""
    payload = data[HEADER_SIZE:]
    tail = struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload
    return data[:12] + struct.pack("<I", zlib.crc32(tail)) + tail


def with_part_name(pte: bytes, part: str) -> bytes:
    """`pte` without its named data (so init refuses its first et-trt delegate naming the part: the named data is
    missing) and with that delegate's part renamed `part`: a long refusal line holding `part`."""
    def rename(data: bytes) -> bytes:
        contents = blob.deserialize(bytes(data))
        contents.part = part
        return blob.serialize(contents)

    return rewrite_blob(pte, rename, named_data=False)
