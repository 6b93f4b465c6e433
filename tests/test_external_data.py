"""Weights, kernel images and engines as ExecuTorch named data: in the .pte by default, in a .ptd
beside a small .pte with `et-trt export --external-data` (ExecuTorch's external-constant tag).

The example is exported both ways: the same ONNX and bytes, the same outputs through the ONNX
reference path; the delegate reads the named data through ExecuTorch's runtime (the Python runtime
and et_trt_runner), and a missing, foreign or corrupted .ptd is refused naming the file and key.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import random
import re
import shutil
import sys

import numpy as np
import pytest
import torch

from et_trt_backend.serialization import blob, external_data
from et_trt_backend.serialization.pte import read_partitions
from et_trt_partitioner import cli
from support import moe_models, onnx_reference
from support.lowering import concrete_shape, lower_program, run_reference_evaluator
from support.runtime_runs import NOT_BUILT, RUNNER, joined_log, load_method_refused, run_process

TAG = "policy"


@pytest.fixture(scope="module")
def external(tmp_path_factory) -> pathlib.Path:
    """The example exported with --external-data: policy.pte and policy.ptd."""
    folder = tmp_path_factory.mktemp("external")
    assert cli.main(["-q", "export", "--output", str(folder / f"{TAG}.pte"), "--external-data", str(folder)]) == 0
    return folder / f"{TAG}.pte"


def _partitions(pte: pathlib.Path, *data_files) -> dict[str, blob.BlobContents]:
    return {p.contents.part: p.contents for p in read_partitions(pte.read_bytes(), data_files)}


def test_external_data_leaves_a_small_pte_and_the_same_partitions(external, example_pte):
    ptd = external.with_suffix(".ptd")
    assert ptd.is_file()
    assert external.stat().st_size < 1 << 20, f"{external.stat().st_size} bytes"
    inside, outside = _partitions(example_pte), _partitions(external, ptd)
    assert sorted(inside) == sorted(outside) == ["decoder", "velocity"]
    for part, contents in outside.items():
        assert contents.data_file == f"{TAG}.ptd" and inside[part].data_file == ""
        assert contents.onnx == inside[part].onnx
        assert contents.named_data() == inside[part].named_data()  # keys, sizes, digests
        assert [d.bytes() for d in contents.named_data()] == [d.bytes() for d in inside[part].named_data()]
        assert contents.weights, f"{part}: no external weights"


def test_both_exports_give_the_same_outputs_through_the_onnx_reference_path(external, example_pte):
    inside, outside = _partitions(example_pte), _partitions(external, external.with_suffix(".ptd"))
    for part, contents in outside.items():
        feeds = {spec.name: torch.randn(concrete_shape(spec, 9)).numpy() for spec in contents.inputs}
        got, expected = (run_reference_evaluator(onnx_reference.to_float32(external_data.onnx_with_weights(c.onnx, c.weights)),
                                                 feeds) for c in (contents, inside[part]))
        assert len(got) == len(expected) == len(contents.outputs)
        for a, b in zip(got, expected):
            assert np.isfinite(a).all()
            np.testing.assert_array_equal(a, b)


def test_the_weights_are_stored_once_by_content(external):
    """Equal bytes share one key, across partitions too: the .ptd holds each distinct one once."""
    from et_trt_backend.serialization.pte import read_data_file

    stored = read_data_file(external.with_suffix(".ptd"))
    named = {d.key: d.size for contents in _partitions(external, external.with_suffix(".ptd")).values()
             for d in contents.named_data()}
    assert set(stored) == set(named)
    assert {key: len(data) for key, data in stored.items()} == named


# ---- through ExecuTorch's runtime ---------------------------------------------------------------------------
def _load_in_python(pte: pathlib.Path, ptd: pathlib.Path | None) -> str:
    """The joined log of loading `pte` (with `ptd`) through ExecuTorch's Python runtime, refused."""
    return joined_log(load_method_refused(pte, ptd).stderr)


def test_the_delegate_reads_its_named_data_through_the_python_runtime(built_runtime, external):
    with_data = _load_in_python(external, external.with_suffix(".ptd"))
    assert NOT_BUILT in with_data, with_data[-3000:]  # past the named data: only TensorRT is missing
    assert "named data" not in with_data, with_data[-3000:]
    without = _load_in_python(external, None)
    assert "is not in the program's named data" in without and f"exported to '{TAG}.ptd'" in without, without[-3000:]
    assert NOT_BUILT not in without


def test_the_runner_reads_named_data_from_data_path(built_runtime, external, tmp_path):
    ptd = external.with_suffix(".ptd")
    result = run_process([RUNNER, external, "--data-path", ptd, "--iterations", "1"])
    assert result.returncode == 1 and NOT_BUILT in result.stderr, result.stderr[-3000:]
    result = run_process([RUNNER, external, "--iterations", "1"])
    assert result.returncode == 1
    log = joined_log(result.stderr)
    assert "is not in the program's named data" in log and f"--data-path {TAG}.ptd" in log, log[-3000:]
    result = run_process([RUNNER, external, "--data-path", tmp_path / "none.ptd"])
    assert result.returncode == 1 and f"cannot open data file {tmp_path / 'none.ptd'}" in result.stderr


def _corrupted_ptd(external: pathlib.Path, folder: pathlib.Path) -> tuple[pathlib.Path, blob.NamedData]:
    """A copy of the .ptd with one byte flipped inside the decoder's first weight, and that weight."""
    ptd = external.with_suffix(".ptd")
    weight = _partitions(external, ptd)["decoder"].weights[0].data
    data = bytearray(ptd.read_bytes())
    at = bytes(data).find(weight.bytes())
    assert at > 0
    data[at + weight.size // 2] ^= 0x10
    bad = folder / ptd.name
    bad.write_bytes(bytes(data))
    return bad, weight


def test_a_corrupted_ptd_is_refused_naming_the_file_and_key(built_runtime, external, tmp_path):
    bad, weight = _corrupted_ptd(external, tmp_path)
    result = run_process([RUNNER, external, "--data-path", bad, "--iterations", "1"])
    assert result.returncode == 1
    log = joined_log(result.stderr)
    assert f"(named data {weight.key}, {weight.size} bytes): its sha256 is" in log, log[-3000:]
    assert f"'{TAG}.ptd' is corrupted or from another export" in log
    assert NOT_BUILT not in log
    code = cli.main(["-q", "check", str(external), "--data", str(bad)])
    assert code == 1


def test_a_ptd_of_another_export_is_refused_saying_so(built_runtime, external, tmp_path, capsys):
    other = tmp_path / f"{TAG}.pte"
    exported = moe_models.export(moe_models.bf16(moe_models.GroupedMoE()))
    external_data.tag_weights(exported, TAG)
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_partitioner import TensorRTPartitioner

    program = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(
        {"default": {"kernel_archs": ["sm_80"], "engine_build": "never"}})]).to_executorch()
    program.write_tensor_data_to_file(str(tmp_path))
    other.write_bytes(program.buffer)
    foreign = tmp_path / f"{TAG}.ptd"
    result = run_process([RUNNER, external, "--data-path", foreign, "--iterations", "1"])
    assert result.returncode == 1
    log = joined_log(result.stderr)
    said = (r"is not in the program's named data \(NamedDataMap: Error::NotFound\)\. The program's data holds \d+ of "
            r"this part's \d+ named data \(\d+ et-trt entries in all\): the data file it was loaded with is from "
            rf"another export, or damaged; load the program with the '{TAG}.ptd' exported with this .pte")
    assert re.search(said, log), log[-3000:]
    assert re.search(said, _load_in_python(external, foreign))
    assert cli.main(["-q", "inspect", str(external), "--data", str(foreign)]) == 0
    assert re.search(rf"named data in {TAG}.ptd, NOT FOUND \({TAG}.ptd is from another export, or damaged: it holds "
                     rf"\d+ of this part's \d+ named data; pass the {TAG}.ptd exported with this .pte\)",
                     capsys.readouterr().out)
    assert cli.main(["-q", "check", str(external), "--data", str(foreign)]) == 1
    assert f"{TAG}.ptd is from another export, or damaged" in capsys.readouterr().err


def _wild_root_table(external: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """A copy of the .ptd whose root table's offset to its vtable points far outside the file: one of the edits
    that crash ExecuTorch's FlatTensorDataMap, which reads the flatbuffer unverified (issue 34)."""
    data = bytearray(external.with_suffix(".ptd").read_bytes())
    root = int.from_bytes(data[:4], "little")
    data[root:root + 4] = (0x7FFF0000).to_bytes(4, "little")
    bad = folder / "wild.ptd"
    bad.write_bytes(bytes(data))
    return bad


def test_both_front_ends_refuse_a_damaged_ptd_in_one_line_before_executorch_reads_it(built_runtime, external,
                                                                                     tmp_path):
    bad = _wild_root_table(external, tmp_path)
    problem = f"{bad}: its flatbuffer (the key table, "
    result = run_process([RUNNER, external, "--data-path", bad, "--iterations", "1"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"et_trt_runner: {problem}") and result.stderr.count("\n") == 1, result.stderr
    script = ("from et_trt_backend import runtime\n"
              "try:\n"
              f"    runtime.load_program({str(external)!r}, data_path={str(bad)!r})\n"
              "except runtime.DataFileError as e:\n"
              "    print(e)\n")
    result = run_process([sys.executable, "-c", script])
    assert result.returncode == 0 and result.stdout.startswith(problem) and result.stdout.count("\n") == 1, result


def test_a_ptd_with_a_key_twice_is_refused_naming_the_ptd(built_runtime, external, tmp_path):
    """A key table whose second key is the first's text again (one bit of the fuzz's did the same through an
    offset): ExecuTorch refuses it blaming the .pte ("Duplicate key ... in named data maps", "not a valid
    ExecuTorch program"); the data file check names the .ptd."""
    data = bytearray(external.with_suffix(".ptd").read_bytes())
    first, second = (m.start() for m in itertools.islice(re.finditer(rb"et_trt/[0-9a-f]{64}", bytes(data)), 2))
    data[second:second + 71] = data[first:first + 71]
    bad = tmp_path / "twice.ptd"
    bad.write_bytes(bytes(data))
    result = run_process([RUNNER, external, "--data-path", bad, "--iterations", "1"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.match(rf"et_trt_runner: {re.escape(str(bad))}: named data \d+ repeats the key of named data \d+ "
                    r"\(each key names one tensor\); copy the file again", result.stderr), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_inspect_and_check_refuse_a_damaged_ptd_in_one_line(external, tmp_path, capsys):
    """Not with flatc's command line, which crashes on this file (issue 35)."""
    bad = _wild_root_table(external, tmp_path)
    for command in ("inspect", "check"):
        assert cli.main(["-q", command, str(external), "--data", str(bad)]) != 0
        err = capsys.readouterr().err
        assert f"{bad}: its flatbuffer (the key table) does not parse; copy the file again" in err, err
        assert err.count("\n") == 1 and "flatc" not in err, err


@pytest.mark.parametrize("front_end", ["et_trt_runner", "Python"])
def test_ptd_and_blob_mutants_are_refused_in_one_line_without_a_crash(built_runtime, external, tmp_path, front_end):
    """A few hundred of support/loading_fuzz.py's mutants (its full run is >= 7000, runtime/README.md "Tests"): data
    files cut, flipped and with swapped keys, and resealed blobs, each refused by the data file check, the blob
    reader, the named data's digests or (past them all) for want of TensorRT; none crashes or is refused unclearly."""
    from support import loading_fuzz

    seed = random.randrange(1 << 30)
    ptd_count, blob_count = (60, 60) if front_end == "et_trt_runner" else (100, 100)
    subject = loading_fuzz.Subject(external, external.with_suffix(".ptd"), seed, ptd_count)
    env = dict(os.environ, ET_TRT_RUNTIME_LIBRARY=str(built_runtime / "libet_trt_runtime.so"))
    paths, indices = (external, external.with_suffix(".ptd")), range(ptd_count + blob_count)
    if front_end == "et_trt_runner":
        outcomes = loading_fuzz.through_runner(subject, paths, RUNNER, indices, tmp_path, env)
    else:
        outcomes = loading_fuzz.through_python(subject, paths, indices, tmp_path, env)
    bad = [o for o in outcomes if o.verdict in ("crash", "unclear")]
    assert not bad, f"seed {seed}: mutant {bad[0].index} ({bad[0].kind}) {bad[0].verdict}:\n{bad[0].detail}"
    verdicts = {o.verdict for o in outcomes}
    assert {"data file", "named data", "blob"} <= verdicts, (seed, loading_fuzz.summary(front_end, outcomes))


# ---- et-trt inspect and check ------------------------------------------------------------------------------
def test_inspect_and_check_find_the_ptd_beside_the_pte(external, tmp_path, capsys):
    assert cli.main(["-q", "inspect", str(external)]) == 0
    out = capsys.readouterr().out
    assert out.count(f"named data in {TAG}.ptd\n") == 2, out
    alone = tmp_path / external.name
    shutil.copy(external, alone)
    assert cli.main(["-q", "inspect", str(alone)]) == 0
    assert f"named data in {TAG}.ptd, NOT FOUND (pass --data {TAG}.ptd)" in capsys.readouterr().out
    assert cli.main(["-q", "check", str(alone)]) == 1
    err = capsys.readouterr().err
    assert f"is not in the .pte; it was exported to '{TAG}.ptd': give the program its data file" in err, err
    assert cli.main(["-q", "check", str(alone), "--data", str(external.with_suffix(".ptd"))]) == 0


def test_dump_onnx_writes_the_weights_as_onnx_external_data(external, tmp_path, capsys):
    import onnx

    assert cli.main(["-q", "inspect", str(external), "--dump-onnx", str(tmp_path)]) == 0
    for path in sorted(tmp_path.glob("*.onnx")):
        model = onnx.load(str(path))  # loads the external data beside it, as trtexec does
        assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)
        onnx.checker.check_model(model)


def test_partition_weights_with_two_tags_are_refused():
    exported = moe_models.export(moe_models.bf16(moe_models.GroupedMoE()))
    external_data.tag_weights(exported, "a")
    next(n for n in exported.graph.nodes if n.op == "placeholder").meta["custom"]["delegate_constant_tag"] = "b"
    from et_trt_partitioner import TensorRTPartitioner

    with pytest.raises(Exception, match="its weights carry several external data tags \\(a, b\\)"):
        lower_program(exported, TensorRTPartitioner({"default": {"kernel_archs": ["sm_80"], "engine_build": "never"}}))
