"""Damaged data files (.ptd) and resealed delegate blobs through both ExecuTorch front ends we ship,
et_trt_runner and the Python runtime (et_trt_backend.runtime.load_program): each must be refused in one
clear line, nothing may crash (issue 34). tests/test_external_data.py runs a few hundred mutants of the
example exported with --external-data; the full run (>= 2000 .ptd and >= 5000 blob mutants, the runtime
built with AddressSanitizer and UBSan; runtime/README.md, "Tests") is:

    ./scripts/build_runtime.sh --build-dir runtime/build-asan -DET_TRT_SANITIZE=ON -DET_TRT_BUILD_TESTS=OFF
    .venv/bin/et-trt export --output /tmp/fuzz/policy.pte --external-data /tmp/fuzz
    .venv/bin/python tests/support/loading_fuzz.py /tmp/fuzz/policy.pte --build runtime/build-asan --sanitized \\
        --ptd-mutants 2000 --blob-mutants 5000

A mutant is made from (seed, index) alone, so a crash names what reproduces it. The Python runtime runs
the mutants one after another in a child process, which is started again after the one that killed it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import random
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/, when run as a script

from et_trt_backend.serialization.blob import HEADER_SIZE, deserialize  # noqa: E402
from support import damaged_pte  # noqa: E402
from support.damaged_pte import reseal  # noqa: E402
from support.runtime_runs import joined_log  # noqa: E402

PTD_KINDS = ("truncation", "header bit", "key table bit", "key table word", "payload byte", "swapped keys")
BLOB_KINDS = ("bit", "word", "word swap", "truncated string")
CRASH_MARKS = ("Sanitizer", "runtime error:", "Segmentation fault", "Aborted", "terminate called")
EXTREMES = (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


@dataclasses.dataclass
class Mutant:
    index: int
    kind: str  # "ptd <kind>" or "blob <kind>"
    pte: bytes | None  # None: the good .pte
    ptd: bytes | None  # None: the good .ptd


class Subject:
    """A good .pte and its .ptd, and the mutants made from them."""

    def __init__(self, pte: pathlib.Path, ptd: pathlib.Path, seed: int, ptd_mutants: int):
        self.pte, self.ptd, self.seed, self.ptd_mutants = pte.read_bytes(), ptd.read_bytes(), seed, ptd_mutants
        offset, size, self.segment_base = struct.unpack_from("<QQQ", self.ptd, 16)
        self.table_end = offset + size
        # Every key is et_trt/<sha256 hex>: swapping two keys' text swaps the payloads they name.
        self.keys = [m.start() for m in re.finditer(rb"et_trt/[0-9a-f]{64}", self.ptd[: self.table_end])]
        # Each blob's place in the .pte and the offsets of its flatbuffer outside the ONNX bytes (most of a blob,
        # where a change is still a well-formed blob): the mutants change its structure.
        self.blobs = []
        for data in damaged_pte.blobs(self.pte):
            onnx = deserialize(data).onnx
            start = data.find(onnx)
            structure = [*range(HEADER_SIZE, start - 4), *range(start + len(onnx), len(data) - 4)]
            self.blobs.append((self.pte.find(data), len(data), structure))

    def mutant(self, index: int) -> Mutant:
        rng = random.Random(f"{self.seed}:{index}")
        if index < self.ptd_mutants:
            kind = PTD_KINDS[index % len(PTD_KINDS)]
            return Mutant(index, f"ptd {kind}", None, self._ptd(kind, rng))
        kind = BLOB_KINDS[index % len(BLOB_KINDS)]
        return Mutant(index, f"blob {kind}", self._pte(kind, rng), None)

    def _ptd(self, kind: str, rng: random.Random) -> bytes:
        data = bytearray(self.ptd)
        if kind == "truncation":
            end = self.table_end + 64 if rng.random() < 0.8 else len(data)
            return bytes(data[: rng.randrange(end)])
        if kind == "header bit":
            data[rng.randrange(48)] ^= 1 << rng.randrange(8)
        elif kind == "key table bit":
            data[rng.randrange(48, self.table_end)] ^= 1 << rng.randrange(8)
        elif kind == "key table word":
            at = rng.randrange(0, self.table_end - 4) & ~3
            data[at:at + 4] = struct.pack("<I", rng.choice(EXTREMES + (rng.getrandbits(32),)))
        elif kind == "payload byte":
            data[rng.randrange(self.segment_base, len(data))] ^= 1 << rng.randrange(8)
        elif kind == "swapped keys" and len(self.keys) > 1:
            a, b = rng.sample(self.keys, 2)
            data[a:a + 71], data[b:b + 71] = self.ptd[b:b + 71], self.ptd[a:a + 71]
        return bytes(data)

    def _pte(self, kind: str, rng: random.Random) -> bytes:
        at, size, payload = rng.choice(self.blobs)
        blob = bytearray(self.pte[at:at + size])
        if kind == "bit":
            blob[rng.choice(payload)] ^= 1 << rng.randrange(8)
        elif kind == "word":
            i = rng.choice(payload) & ~3
            blob[i:i + 4] = struct.pack("<I", rng.choice(EXTREMES + (size, rng.getrandbits(32))))
        elif kind == "word swap":
            i, j = (rng.choice(payload) & ~3 for _ in range(2))
            blob[i:i + 4], blob[j:j + 4] = blob[j:j + 4], blob[i:i + 4]
        elif kind == "truncated string":  # a multi-byte character cut in a string: not UTF-8
            i = rng.choice(payload)
            blob[i] = 0xC3
        pte = bytearray(self.pte)
        pte[at:at + size] = reseal(bytes(blob))
        return bytes(pte)


@dataclasses.dataclass
class Outcome:
    index: int
    kind: str
    verdict: str  # "data file", "blob", "named data", "engine" (refused past every check: no TensorRT), "crash", "unclear"
    detail: str


def _verdict(log: str) -> str:
    """Which check refused, from a refusal's log (the delegate's lines joined)."""
    if "refusing delegate blob: part" in log and "named data" in log:
        return "named data"
    if "refusing delegate blob:" in log:
        return "blob"
    if "cannot initialize part" in log:
        return "engine"
    return "unclear"


def _write(mutant: Mutant, subject_paths: tuple[pathlib.Path, pathlib.Path], workdir: pathlib.Path):
    """The mutant's .pte and .ptd paths: the good files, or the mutant's bytes written under `workdir`."""
    pte, ptd = subject_paths
    if mutant.pte is not None:
        pte = workdir / "mutant.pte"
        pte.write_bytes(mutant.pte)
    if mutant.ptd is not None:
        ptd = workdir / "mutant.ptd"
        ptd.write_bytes(mutant.ptd)
    return pte, ptd


def through_runner(subject: Subject, paths, runner: pathlib.Path, indices, workdir: pathlib.Path,
                   env: dict) -> list[Outcome]:
    outcomes = []
    for index in indices:
        mutant = subject.mutant(index)
        pte, ptd = _write(mutant, paths, workdir)
        result = subprocess.run([str(runner), str(pte), "--data-path", str(ptd), "--warmup", "0", "--iterations", "1"],
                                capture_output=True, text=True, errors="replace", timeout=300, env=env)
        ours = [line for line in result.stderr.splitlines() if line.startswith("et_trt_runner:")]
        if result.returncode not in (0, 1) or any(mark in result.stderr for mark in CRASH_MARKS):
            verdict = "crash"
        elif len(ours) != 1:
            verdict = "unclear"
        elif ours[0].startswith(f"et_trt_runner: {ptd}: "):
            verdict = "data file"
        elif "cannot load method 'forward'" in ours[0]:
            verdict = _verdict(joined_log(result.stderr))
        else:
            verdict = "unclear"
        outcomes.append(Outcome(index, mutant.kind, verdict, result.stderr[-3000:]))
    return outcomes


def through_python(subject: Subject, paths, indices: range, workdir: pathlib.Path, env: dict) -> list[Outcome]:
    """The mutants through runtime.load_program in child processes; one restarted after each crash."""
    outcomes, start = [], indices.start
    while start < indices.stop:
        log_path = workdir / "python.log"
        with open(log_path, "w") as log:
            child = subprocess.run(
                [sys.executable, __file__, "--child", str(paths[0]), "--data", str(paths[1]), "--seed", str(subject.seed),
                 "--ptd-mutants", str(subject.ptd_mutants), "--start", str(start), "--stop", str(indices.stop),
                 "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=log, text=True, timeout=3600, env=env)
        stderr = log_path.read_text(errors="replace")
        logs = dict(re.findall(r"^@@mutant (\d+)\n(.*?)(?=^@@mutant |\Z)", stderr, re.M | re.S))
        done = [line.split("\t", 2) for line in child.stdout.splitlines() if line.count("\t") >= 2]
        for index, kind, message in done:
            log = joined_log(logs.get(index, ""))
            if message.startswith("DataFileError: ") and "\n" not in message:
                verdict = "data file"
            elif message.startswith("RuntimeError: ") and any(m in log for m in CRASH_MARKS):
                verdict = "crash"
            elif message.startswith("RuntimeError: "):
                verdict = _verdict(log)
            else:
                verdict = "unclear"
            outcomes.append(Outcome(int(index), kind, verdict, message + "\n" + log[-2000:]))
        start = int(done[-1][0]) + 1 if done else start
        if child.returncode != 0:  # the mutant after the last one reported killed it
            mutant = subject.mutant(start)
            outcomes.append(Outcome(start, mutant.kind, "crash", f"exit {child.returncode}\n{stderr[-3000:]}"))
            start += 1
    return outcomes


def _child(args: argparse.Namespace) -> None:
    """Loads mutants start..stop-1 one by one; prints "index<TAB>kind<TAB>ExceptionType: message" for each."""
    from et_trt_backend import runtime

    runtime.load()
    subject = Subject(args.pte, args.data, args.seed, args.ptd_mutants)
    for index in range(args.start, args.stop):
        mutant = subject.mutant(index)
        pte, ptd = _write(mutant, (args.pte, args.data), args.workdir)
        print(f"@@mutant {index}", file=sys.stderr, flush=True)
        try:
            runtime.load_program(str(pte), data_path=str(ptd)).load_method("forward")
            message = "loaded"
        except Exception as e:  # what a user's program would see
            message = f"{type(e).__name__}: {e}"
        print(f"{index}\t{mutant.kind}\t{message}", flush=True)


def summary(front_end: str, outcomes: list[Outcome]) -> str:
    counts = collections.Counter(o.verdict for o in outcomes)
    return (f"{front_end:14} {len(outcomes):8} " + " ".join(f"{counts[v]:10}" for v in
                                                            ("data file", "blob", "named data", "engine"))
            + f" {counts['unclear']:8} {counts['crash']:8}")


HEADER = (f"{'front end':14} {'mutants':>8} {'data file':>10} {'blob':>10} {'named data':>10} {'engine':>10} "
          f"{'unclear':>8} {'crashes':>8}")


def sanitized_env(build: pathlib.Path) -> dict:
    """The environment for the runner and Python with the runtime in `build`: AddressSanitizer's runtime
    preloaded for Python (which is not built with it), with libstdc++, whose __cxa_throw ASan must find at
    start (else it aborts at torch's first C++ exception); no leak check (Python keeps its objects)."""
    preload = [subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
               for name in ("libasan.so", "libstdc++.so")]
    return dict(os.environ, LD_PRELOAD=" ".join(preload), ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                UBSAN_OPTIONS="print_stacktrace=1", ET_TRT_RUNTIME_LIBRARY=str(build / "libet_trt_runtime.so"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pte", type=pathlib.Path)
    parser.add_argument("--data", type=pathlib.Path, help="its .ptd (default: beside it, same name)")
    parser.add_argument("--build", type=pathlib.Path, default=pathlib.Path("runtime/build"))
    parser.add_argument("--sanitized", action="store_true", help="the build has -DET_TRT_SANITIZE=ON")
    parser.add_argument("--ptd-mutants", type=int, default=2000)
    parser.add_argument("--blob-mutants", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data = args.data or args.pte.with_suffix(".ptd")
    if args.child:
        _child(args)
        return 0
    env = (sanitized_env(args.build) if args.sanitized
           else dict(os.environ, ET_TRT_RUNTIME_LIBRARY=str(args.build / "libet_trt_runtime.so")))
    subject = Subject(args.pte, args.data, args.seed, args.ptd_mutants)
    total = args.ptd_mutants + args.blob_mutants
    print(f"seed {args.seed}: {args.ptd_mutants} .ptd and {args.blob_mutants} blob mutants of {args.pte}", flush=True)
    with tempfile.TemporaryDirectory() as work:
        runner = through_runner(subject, (args.pte, args.data), args.build / "et_trt_runner", range(total),
                                pathlib.Path(work), env)
        python = through_python(subject, (args.pte, args.data), range(total), pathlib.Path(work), env)
    bad = [o for o in runner + python if o.verdict in ("crash", "unclear")]
    for o in bad[:20]:
        print(f"mutant {o.index} ({o.kind}): {o.verdict}\n{o.detail}\n")
    print(HEADER)
    print(summary("et_trt_runner", runner))
    print(summary("Python", python))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
