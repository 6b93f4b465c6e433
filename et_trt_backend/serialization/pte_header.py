"""What a .pte's first bytes say, read without ExecuTorch: a file that is no ExecuTorch program is refused
before torch and ExecuTorch are imported (serialization/pte.py reads the rest with ExecuTorch)."""

from __future__ import annotations

import re


class PteError(ValueError):
    """The file is not a readable ExecuTorch program."""


def check_identifier(pte: bytes) -> None:
    """PteError unless the bytes carry the flatbuffer identifier of an ExecuTorch program ("ET" + schema
    version at byte 4)."""
    if len(pte) < 8 or not re.fullmatch(rb"ET\d\d", pte[4:8]):
        raise PteError(f"not an ExecuTorch program: {len(pte)} bytes without the 'ET..' identifier at byte 4 "
                       "that every .pte has; export it with to_executorch() or `et-trt export`")
