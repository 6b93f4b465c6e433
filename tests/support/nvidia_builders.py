"""The NVIDIA builders tests use, or a skip that says what is missing."""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest

from et_trt_backend.engines import providers


def tensorrt_rtx_or_skip() -> providers.Builder:
    """TensorRT for RTX, ready to build; skips the test (with the reason) where it is absent or unusable."""
    try:
        return providers.tensorrt_rtx()
    except providers.BuilderUnavailable as e:
        pytest.skip(f"needs TensorRT for RTX ({providers.RTX_EXTRA}): {e}")


class PluginFields(NamedTuple):
    trans_b: int
    kernel_images_id: bytes
    activation: int


# One GroupedMM node's fields as a TensorRT (for RTX) 1.7 plan stores them: each field's name length, name,
# type and element count, then its data: trans_b (INT32 = 5, one element), kernel_images_id (UNKNOWN = 8,
# 32 bytes), activation (INT32). The rest of a plan is not comparable: the same network builds different plans
# from one build to the next (kernel choices), whichever plugin serves it.
_IMAGES_ID_FIELD = rb"\x11\x00\x00\x00kernel_images_id\x00\x08\x00\x00\x00\x20\x00\x00\x00(.{32})"
_PLUGIN_FIELDS = re.compile(
    rb"\x08\x00\x00\x00trans_b\x00\x05\x00\x00\x00\x01\x00\x00\x00(.{4})" + _IMAGES_ID_FIELD +
    rb"\x0b\x00\x00\x00activation\x00\x05\x00\x00\x00\x01\x00\x00\x00(.{4})", re.S)


def serialized_plugin_fields(plan: bytes) -> list[PluginFields]:
    """Every GroupedMM plugin's serialized fields in `plan`, in plan order."""
    return [PluginFields(int.from_bytes(trans_b, "little"), images_id, int.from_bytes(activation, "little"))
            for trans_b, images_id, activation in _PLUGIN_FIELDS.findall(plan)]


# The group_size field GroupedMM and MoEExperts plugins serialize (INT32, one element): INT4 weights' scale groups, 0
# for weights not INT4.
_GROUP_SIZE_FIELD = re.compile(rb"\x0b\x00\x00\x00group_size\x00\x05\x00\x00\x00\x01\x00\x00\x00(.{4})", re.S)


def serialized_group_sizes(plan: bytes) -> list[int]:
    """The group_size field of every plugin in `plan` that has one, in plan order."""
    return [int.from_bytes(value, "little") for value in _GROUP_SIZE_FIELD.findall(plan)]


def serialized_kernel_images_ids(plan: bytes) -> list[bytes]:
    """The kernel_images_id field of every plugin in `plan` (GroupedMM's and MoEExperts' alike), in plan order."""
    return re.compile(_IMAGES_ID_FIELD, re.S).findall(plan)


# What a TensorRT for RTX 1.7 plan records of the compute capability it was built for: its compiler's header
# names the accelerators, e.g. "accelerators={sm86 }" (seen for sm80, sm86, sm89 and sm120 builds; the same plans
# as TensorRT for RTX's Python API builds with config.set_compute_capability).
_BUILT_TARGET = re.compile(rb"accelerators=\{sm(\d+) \}")


def built_target(plan: bytes) -> int:
    """The one compute capability (major * 10 + minor) `plan` was built for."""
    (target,) = set(_BUILT_TARGET.findall(plan))
    return int(target)
