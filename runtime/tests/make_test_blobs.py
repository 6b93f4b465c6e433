"""Puts the blobs and programs the C++ tests read (write_test_blobs.py) into the directory given as argv[1].

Every ctest suite (runtime/build, the TensorRT builds, the aarch64 builds: they read the same files) runs this
first. Writing them means importing torch and ExecuTorch and exporting a policy, seconds that were most of a
TensorRT build's suite, so they are written once into runtime/build-test-blobs/<key> and copied from there: the
key is a digest of everything they are made from (these scripts, the Python packages' sources, the installed
distributions' versions, Python's, and the example .pte with the .ptd files beside it), so any change writes them
anew. The newest few entries are kept.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / "runtime" / "build-test-blobs"
KEPT = 4
SOURCES = (REPO / "et_trt_backend", REPO / "partitioner")


def example_pte() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ET_TRT_EXAMPLE_PTE", REPO / "out" / "moe_policy.pte"))


def _key(pte: pathlib.Path) -> str:
    digest = hashlib.sha256(sys.version.encode())
    files = {f.relative_to(REPO): f for f in HERE.glob("*.py")}
    for top in SOURCES:
        files |= {f.relative_to(REPO): f for f in top.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    if pte.is_file():  # by content, not path: the test run's own export (tests/conftest.py) shares setup's entry
        files[pathlib.Path("example.pte")] = pte
        files |= {pathlib.Path("example", f.name): f for f in pte.parent.glob("*.ptd")}
    for name, path in sorted(files.items()):
        digest.update(f"\0{name}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    versions = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join(versions).encode())
    return digest.hexdigest()[:24]


def _cached(pte: pathlib.Path) -> pathlib.Path:
    """The cache entry for `pte` and these sources, written now if there is none."""
    entry = CACHE / _key(pte)
    if entry.is_dir():
        print(f"test blobs from {entry}")
        entry.touch()  # in use: kept
        return entry
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = pathlib.Path(tempfile.mkdtemp(prefix=f"{entry.name}.partial.", dir=CACHE))
    sys.path.insert(0, str(HERE))
    import write_test_blobs  # here: torch and ExecuTorch load only when the blobs are written

    try:
        write_test_blobs.write(partial, pte)
    except BaseException:
        shutil.rmtree(partial)
        raise
    try:
        partial.rename(entry)  # whole or not at all; a suite running beside this one may have written it first
    except OSError:
        shutil.rmtree(partial)
    for old in sorted((p for p in CACHE.iterdir() if ".partial." not in p.name), key=lambda p: p.stat().st_mtime,
                      reverse=True)[KEPT:]:
        shutil.rmtree(old, ignore_errors=True)
    return entry


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    pte = example_pte()
    entry = _cached(pte)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(entry, out)
    if pte.is_file():
        (out / "example.pte").symlink_to(pte.resolve())


if __name__ == "__main__":
    main()
