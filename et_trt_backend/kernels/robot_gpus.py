"""Which robot GPUs a partition's kernel images serve, and how.

The C++ launcher picks, for each kernel, the image that serves the GPU it runs
on (runtime/kernels/image_loading.cc, `serves`): an arch-specific cubin
(sm_90a, sm_110a) on that compute capability only; another cubin on the same
major with an equal or lower minor (sm_80's on sm_87); else PTX of an equal or
lower architecture, which the CUDA driver JIT-compiles at load if its PTX ISA
version is one the driver knows. Needs neither Triton nor a GPU.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from et_trt_backend.kernels.aot import KernelImage


@dataclasses.dataclass(frozen=True)
class RobotGpu:
    name: str
    compute_capability: int  # major * 10 + minor
    jetpack: str
    max_ptx_isa: tuple[int, int]  # the newest PTX ISA its JetPack's CUDA driver JIT-compiles


ROBOT_GPUS = (
    RobotGpu("Jetson Orin", 87, "JetPack 6 (CUDA 12.6)", (8, 5)),
    RobotGpu("Jetson Thor", 110, "JetPack 7 (CUDA 13.0)", (9, 0)),
)


def _arch(arch: str) -> tuple[int, bool]:
    """"sm_90a" -> (90, True); (-1, False) when malformed, as the launcher reads it."""
    match = re.fullmatch(r"sm_(\d+)(a?)", arch)
    return (int(match.group(1)), match.group(2) == "a") if match else (-1, False)


def _serves(image: KernelImage, cc: int) -> bool:
    cap, specific = _arch(image.arch)
    if cap < 0:
        return False
    if specific:
        return cap == cc
    if image.format == "cubin":
        return cap // 10 == cc // 10 and cap <= cc
    return cap <= cc


def chosen_images(images: Sequence[KernelImage], cc: int) -> list[KernelImage]:
    """Per kernel, the image the launcher loads on a GPU of compute capability `cc`: a cubin over
    PTX, then the highest architecture."""
    chosen: dict[str, KernelImage] = {}
    for image in images:
        if not _serves(image, cc):
            continue
        current = chosen.get(image.kernel)
        if current is None or (image.format, current.format) == ("cubin", "ptx") or (
                image.format == current.format and _arch(image.arch)[0] > _arch(current.arch)[0]):
            chosen[image.kernel] = image
    return list(chosen.values())


def _ptx_isa(image: KernelImage) -> tuple[int, int]:
    major, _, minor = image.ptx_version.partition(".")
    return int(major), int(minor or 0)


def how_served(images: Sequence[KernelImage], gpu: RobotGpu) -> str:
    """"sm_87 cubin", "PTX JIT from sm_80", both joined by " + ", or "not served: why"."""
    chosen = chosen_images(images, gpu.compute_capability)
    if not chosen:
        arch = f"sm_{gpu.compute_capability}{'a' if gpu.compute_capability >= 90 else ''}"
        return f"not served: no image for it (add {arch} to kernel_archs)"
    too_new = sorted({i.ptx_version for i in chosen if i.format == "ptx" and _ptx_isa(i) > gpu.max_ptx_isa})
    if too_new:
        return (f"not served: PTX ISA {', '.join(too_new)} is newer than {gpu.jetpack} JIT-compiles "
                f"({'.'.join(map(str, gpu.max_ptx_isa))})")
    ways = [f"{arch} cubin" for arch in sorted({i.arch for i in chosen if i.format == "cubin"})]
    ptx = sorted({i.arch for i in chosen if i.format == "ptx"})
    if ptx:
        ways.append(f"PTX JIT from {', '.join(ptx)}")
    return " + ".join(ways)


def robot_gpus_line(images: Sequence[KernelImage]) -> str:
    """What `et-trt inspect` prints per partition."""
    if not images:
        return ", ".join(gpu.name for gpu in ROBOT_GPUS) + " (no kernel images needed)"
    return ", ".join(f"{gpu.name} ({how_served(images, gpu)})" for gpu in ROBOT_GPUS)
