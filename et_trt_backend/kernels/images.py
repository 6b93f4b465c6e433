"""Compiled kernel images: the record the blob and the launcher take, and the disk cache of them.

aot.py (Triton) and sm90.py (nvcc) both produce these; neither Triton nor nvcc is
needed to read them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
from collections.abc import Callable, Sequence

from et_trt_backend.serialization import schema_generated as fb
from et_trt_backend.serialization.named_data import NamedData

logger = logging.getLogger(__name__)

CACHE_ENV = "ET_TRT_KERNEL_CACHE"
CACHE_FORMAT = 4  # bump when the cached record layout changes


def _snake_case(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name)


# The fields of table KernelImage in schema.fbs (their one definition), in its order: flatc's object API
# (schema_generated.KernelImageT) names them in camelCase; here they are in snake_case.
SCHEMA_NAMES: dict[str, str] = {_snake_case(name): name for name in vars(fb.KernelImageT())}

# weight_format was appended to the schema with a default (Dense) so that older blobs read; records made
# without it are dense too.
WEIGHT_FORMATS = ("dense", "fp8")
KernelImage = dataclasses.make_dataclass(
    "KernelImage",
    [name if name != "weight_format" else (name, str, dataclasses.field(default="dense")) for name in SCHEMA_NAMES],
    frozen=True)
KernelImage.__module__ = __name__
KernelImage.__doc__ = """One compiled kernel: the fields of table KernelImage in schema.fbs, in snake_case.

Strings as str; `format` is "cubin" | "ptx", `dtype` "bf16" | "fp16" and `weight_format` "dense" | "fp8"
(serialization/blob.py maps them to the schema's enums; an fp8 image's dtype is its activations' and output's); `image` is a NamedData holding the cubin or PTX bytes where they are known. `kernel`
is kernel_name(variant, trans_b); `variant` is the launcher's choice among a blob's images
(runtime/kernels/grouped_mm_launcher.h).
"""


def kernel_name(variant: str, trans_b: bool, weight_format: str = "dense") -> str:
    """The kernel's name in logs and inspect: variant, layout, and "fp8" for fp8 weights."""
    return f"grouped_mm_{variant}_{'fp8_' if weight_format == 'fp8' else ''}{'nk' if trans_b else 'kn'}"


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "et_trt" / "kernels")


def cached_image(key: list, build: Callable[[], KernelImage]) -> KernelImage:
    """The image cached under `key` (JSON-able parts naming everything the image depends on), else build() saved there."""
    digest = hashlib.sha256(json.dumps([CACHE_FORMAT, *key]).encode()).hexdigest()[:32]
    path = cache_dir() / (digest + ".json")
    if path.exists():
        try:
            return load_images(path)[0]
        except (ValueError, TypeError, KeyError, IndexError):
            logger.warning("ignoring unreadable kernel cache entry %s", path)
    image = build()
    save_images(path, [image])
    return image


def save_images(path: str | os.PathLike, images: Sequence[KernelImage]) -> None:
    """Writes images as JSON (image bytes in hex); atomic, so a reader never sees half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps([{**dataclasses.asdict(i), "image": i.image.bytes().hex()} for i in images]))
    tmp.replace(path)


def load_images(path: str | os.PathLike) -> list[KernelImage]:
    """Reads what save_images wrote. Needs no Triton."""
    records = json.loads(pathlib.Path(path).read_text())
    return [KernelImage(**{**r, "image": NamedData.of(bytes.fromhex(r["image"]))}) for r in records]
