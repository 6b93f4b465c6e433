"""Kernel images compiled in processes of their own (kernels/parallel_compile.py): each set that is not in the disk
cache compiled by its own process gives the images an in-process compile gives, in the same order; a set whose
process failed is compiled by the caller; a cached set starts no process. Cold caches in tmp_path: sm_80's grouped_mm
images, its cubins and its PTX fallback (two sets, seconds each). tests/test_reproducible.py's cold export compiles
the example's sets in processes (nvcc's sm_90a builds among them) and matches a warm export byte for byte."""

from __future__ import annotations

import subprocess

import pytest

from et_trt_backend.kernels import grouped_mm_images, parallel_compile
from et_trt_backend.kernels.images import CACHE_ENV, NotCached, cache_only, cached_image
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.serialization.named_data import NamedData

pytest.importorskip("triton", reason="compiling kernel images needs Triton")


def _cold_caches(monkeypatch, folder) -> None:
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder / "triton"))


def _images(monkeypatch, folder, jobs: int) -> list[KernelImage]:
    _cold_caches(monkeypatch, folder)
    monkeypatch.setenv(parallel_compile.JOBS_ENV, str(jobs))
    return grouped_mm_images(["sm_80"], "fp16", True)


@pytest.fixture
def compile_processes(monkeypatch):
    """The argument lists of the compile processes parallel_compile starts (Triton's own ptxas runs are not listed)."""
    started = []
    run = subprocess.run

    def spy(command, *args, **kwargs):
        if parallel_compile.__name__ in command:
            started.append(command)
        return run(command, *args, **kwargs)

    monkeypatch.setattr(parallel_compile.subprocess, "run", spy)
    return started


def test_processes_compile_what_the_caller_would_in_its_order(tmp_path, monkeypatch, compile_processes):
    serial = _images(monkeypatch, tmp_path / "serial", jobs=1)
    assert compile_processes == []
    parallel = _images(monkeypatch, tmp_path / "parallel", jobs=2)
    assert [c[-2:] for c in compile_processes] == [
        ["grouped_mm", '["sm_80", "fp16", true, "dense", "cubin"]'],
        ["grouped_mm", '["sm_80", "fp16", true, "dense", "ptx"]']]
    assert [(i.arch, i.format, i.variant) for i in serial] == [
        ("sm_80", "cubin", "tile"), ("sm_80", "cubin", "any"), ("sm_80", "ptx", "tile"), ("sm_80", "ptx", "any")]
    assert parallel == serial  # every record, the images compared by digest
    compile_processes.clear()
    assert _images(monkeypatch, tmp_path / "parallel", jobs=2) == serial  # all cached now: no process
    assert compile_processes == []


def test_a_set_whose_process_failed_is_compiled_by_the_caller(tmp_path, monkeypatch):
    failed = []
    run = subprocess.run

    def failing(command, *args, **kwargs):
        if parallel_compile.__name__ not in command:  # ptxas, in the caller's own compile
            return run(command, *args, **kwargs)
        failed.append(command)
        return subprocess.CompletedProcess(command, 1, "", "Traceback: a compiler error")

    monkeypatch.setattr(parallel_compile.subprocess, "run", failing)
    images = _images(monkeypatch, tmp_path / "cache", jobs=2)
    assert len(failed) == 2 and len(images) == 4
    monkeypatch.undo()
    assert _images(monkeypatch, tmp_path / "serial", jobs=1) == images


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_job_count_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(parallel_compile.JOBS_ENV, value)
    with pytest.raises(ValueError, match=f"{parallel_compile.JOBS_ENV}='{value}'.*1 or more"):
        parallel_compile.jobs()


def test_job_count_defaults_to_the_cpus(monkeypatch):
    monkeypatch.delenv(parallel_compile.JOBS_ENV, raising=False)
    assert parallel_compile.jobs() >= 1
    monkeypatch.setenv(parallel_compile.JOBS_ENV, "3")
    assert parallel_compile.jobs() == 3


def test_cache_only_reads_the_cache_and_never_builds(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    record = KernelImage(kernel="k", variant="v", trans_b=True, arch="sm_80", format="cubin",
                         image=NamedData.of(b"image"), entry="k", dtype="bf16", num_warps=4, shared_bytes=0,
                         global_scratch_bytes=0, global_scratch_align=1, profile_scratch_bytes=0, block_m=1,
                         block_n=1, block_k=1, persistent=False, ptx_version="", weight_format="dense")
    builds = []

    def build() -> KernelImage:
        builds.append(1)
        return record

    with cache_only(), pytest.raises(NotCached):
        cached_image(["a key"], build)
    assert builds == []
    assert cached_image(["a key"], build) == record and builds == [1]
    with cache_only():
        assert cached_image(["a key"], build) == record
    assert builds == [1]
