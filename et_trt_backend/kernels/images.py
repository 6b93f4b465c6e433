"""The disk cache of compiled kernel images (serialization/kernel_image.py's records), as JSON.

aot.py (Triton) and sm90.py (nvcc) cache what they compile here; neither Triton nor
nvcc is needed to read a cached image.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
from collections.abc import Callable, Sequence

from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.serialization.named_data import NamedData

logger = logging.getLogger(__name__)

CACHE_ENV = "ET_TRT_KERNEL_CACHE"
CACHE_FORMAT = 4  # bump when the cached record layout changes


# Set by cache_only(): a miss raises NotCached instead of compiling.
_cache_only = contextvars.ContextVar("cache_only", default=False)


class NotCached(Exception):
    """An image that cache_only() found missing from the disk cache."""


@contextlib.contextmanager
def cache_only():
    """Within it, cached_image() returns cached images and raises NotCached for a missing one: a cheap look at
    whether a set of images needs compiling (parallel_compile.py)."""
    token = _cache_only.set(True)
    try:
        yield
    finally:
        _cache_only.reset(token)


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
    if _cache_only.get():
        raise NotCached(path.name)
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
