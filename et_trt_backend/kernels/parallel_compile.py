"""The kernel images of an export compiled in several processes at once.

A cold export compiles minutes of images (Triton, ptxas, nvcc), one after another, each compile single-threaded.
Callers describe the images as sets, in their order: an architecture's Triton builds, and each nvcc build of
sm_90a's wgmma kernel (a minute or more each) on its own. Every set whose images are not all in the disk cache
(images.py) is compiled by a `python -m et_trt_backend.kernels.parallel_compile` process of its own, up to
ET_TRT_COMPILE_JOBS at a time (default: one per CPU); the caller then reads all of them from the cache in its
order, so an export's bytes do not depend on how its images were compiled. Subprocesses, not multiprocessing: these
compile inside a user's export script, whose main module spawned workers would import again, and whose threads a
forked worker would inherit. A set that a process failed to compile is compiled again in the caller, which raises
the compiler's error.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import logging
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence

from et_trt_backend.kernels.images import NotCached, cache_only
from et_trt_backend.serialization.kernel_image import KernelImage

logger = logging.getLogger(__name__)

JOBS_ENV = "ET_TRT_COMPILE_JOBS"
# The kinds of set: the function that returns a set's images, by name; its arguments are JSON values.
SETS = {
    "grouped_mm": "et_trt_backend.kernels.aot:arch_images",
    "moe_experts": "et_trt_backend.kernels.moe_aot:arch_images",
    "moe_gather": "et_trt_backend.kernels.moe_aot:gather_images",
    "moe_combine_y_in_dtype": "et_trt_backend.kernels.moe_aot:combine_y_in_dtype_images",
    "sm90": "et_trt_backend.kernels.sm90:images",
}
Set = tuple[str, tuple]  # (kind, arguments)


def _function(kind: str):
    module, name = SETS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def jobs() -> int:
    """How many compile processes may run at once: ET_TRT_COMPILE_JOBS, else the CPUs this process may use."""
    value = os.environ.get(JOBS_ENV, "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{JOBS_ENV}={value!r}: set it to a whole number of processes, 1 or more")
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def images(sets: Sequence[Set]) -> list[KernelImage]:
    """The images of `sets`, in order; the sets not all cached compiled in parallel first."""
    results: list[list[KernelImage] | None] = []
    for kind, args in sets:
        try:
            with cache_only():
                results.append(_function(kind)(*args))
        except NotCached:
            results.append(None)
    missing = [s for s, result in zip(sets, results) if result is None]
    if len(missing) > 1 and jobs() > 1:
        _compile_in_processes(missing)
    return [image for (kind, args), result in zip(sets, results)
            for image in (result if result is not None else _function(kind)(*args))]


def _compile_in_processes(missing: list[Set]) -> None:
    workers = min(len(missing), jobs())
    logger.info("compiling %d sets of kernel images in %d processes (%s to change)", len(missing), workers, JOBS_ENV)
    # The child imports this very package, wherever the caller found it (a source checkout, a copy, site-packages).
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}

    def compile_set(kind_and_args: Set) -> None:
        kind, args = kind_and_args
        start = time.monotonic()
        result = subprocess.run([sys.executable, "-m", __name__, kind, json.dumps(args)], env=env,
                                capture_output=True, text=True)
        if result.returncode == 0:
            logger.info("%s kernel images (%s) compiled in %.0f s", kind, ", ".join(map(str, args)),
                        time.monotonic() - start)
        else:  # compiled again by the caller, which raises the error
            logger.debug("the compile process of %s %s failed:\n%s", kind, args, result.stderr[-3000:])

    # The nvcc builds first: each takes longer than any architecture's Triton set.
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(compile_set, sorted(missing, key=lambda s: s[0] != "sm90")))


def main(argv: list[str]) -> int:
    kind, args = argv
    _function(kind)(*json.loads(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
