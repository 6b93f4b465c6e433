"""Which robot GPUs a partition's kernel images serve, and how.

The C++ launcher picks, for each kernel, the image that serves the GPU it runs
on (images_for_gpu in runtime/kernels/image_loading.h), and says which
through its C ABI (kernels/launcher.py): an arch-specific cubin (sm_90a,
sm_110a) on that compute capability only; another cubin on the same major with
an equal or lower minor (sm_80's on sm_87); else PTX of an equal or lower
architecture, which the CUDA driver JIT-compiles at load if its PTX ISA version
is one the robot's driver knows (ROBOT_GPUS). Needs neither Triton nor a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from et_trt_backend.kernels.launcher import LauncherError, images_for_gpu
from et_trt_backend.serialization.kernel_image import KernelImage


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


def _ptx_isa(image: KernelImage) -> tuple[int, int]:
    major, _, minor = image.ptx_version.partition(".")
    return int(major), int(minor or 0)


def how_served(images: Sequence[KernelImage], gpu: RobotGpu) -> str:
    """"sm_87 cubin", "PTX JIT from sm_80", both joined by " + ", or "not served: why"."""
    chosen = images_for_gpu(images, gpu.compute_capability)
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
    try:
        return ", ".join(f"{gpu.name} ({how_served(images, gpu)})" for gpu in ROBOT_GPUS)
    except LauncherError as e:  # the launcher's library is not built here
        return f"not determined: {e}"
