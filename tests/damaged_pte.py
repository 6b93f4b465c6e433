"""Damaged .pte files, made from a good one, for the tools that must refuse them in one clear line."""

from __future__ import annotations

import random

from et_trt_backend import BACKEND_ID
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


def with_part_name(pte: bytes, part: str) -> bytes:
    """`pte` without its named data (so init refuses its first et-trt delegate naming the part: the named data is
    missing) and with that delegate's part renamed `part`: a long refusal line holding `part`."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    from et_trt_backend.serialization import blob

    pte_file = deserialize_pte_binary(pte)
    pte_file.named_data = None
    program = pte_file.program
    delegate = next(d for plan in program.execution_plan for d in plan.delegates if d.id == BACKEND_ID)
    buffer = program.backend_delegate_data[delegate.processed.index]
    contents = blob.deserialize(bytes(buffer.data))
    contents.part = part
    buffer.data = blob.serialize(contents)
    return bytes(serialize_pte_binary(pte_file))
