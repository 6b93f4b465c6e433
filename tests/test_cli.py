"""The et-trt command: export the example policy, inspect and check .pte files, refuse bad input clearly."""

import dataclasses
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from et_trt_backend import BACKEND_ID
from et_trt_backend.engines import providers
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.kernels.robot_gpus import robot_gpus_line
from et_trt_backend.options import DEFAULT_KERNEL_ARCHS
from et_trt_backend.serialization import blob
from et_trt_backend.serialization.named_data import NamedData
from et_trt_backend.serialization.pte import read_delegates, read_partitions
from et_trt_partitioner import cli
from support import damaged_pte

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `et-trt argv`."""
    code = cli.main(["-q", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ---- export --------------------------------------------------------------------------
@pytest.mark.slow
def test_export_writes_one_partition_per_part(example_pte):
    partitions = read_partitions(example_pte.read_bytes())
    assert sorted(p.contents.part for p in partitions) == ["decoder", "velocity"]
    by_part = {p.contents.part: p.contents for p in partitions}
    # The example recipe's per-part options reached each blob.
    assert by_part["velocity"].options.precision == "fp16"
    assert by_part["decoder"].options.shape_ranges["tokens"].max == 512
    assert not list(example_pte.parent.glob("*.partial")), "the temporary file must be renamed away"


@pytest.mark.slow
def test_inspect_reports_partitions_ops_options_kernels_engine(example_pte, capsys):
    code, out, _ = run(capsys, "inspect", example_pte)
    assert code == 0
    assert out.startswith("2 TensorRT partition(s)")
    for part in ("decoder", "velocity"):
        assert re.search(rf"\[\d\] part '{part}': plan 'forward' delegate \d, blob", out)
    assert "et_trt::MoEExperts 2" in out and "et_trt::MoEExperts 1" in out and "TopK" in out
    assert "    MoE blocks: 2 of 2 fused\n      decoder.layers.0.moe: one MoEExperts node (bf16, swiglu, " in out
    assert "velocity.block.moe: one MoEExperts node (fp16, swiglu, blocked8, 8 experts, top-2, hidden 64" in out
    assert '"precision": "fp16"' in out and '"kernel_archs": ["sm_87", "sm_90a", "sm_110a"]' in out
    assert re.search(r"sm_90a\s+cubin moe_gate_up_gated bf16", out)
    # No TensorRT here. TensorRT for RTX, where installed, builds the velocity part's engines for its targets in
    # kernel_archs (sm_80, sm_120a); the decoder's (sm_87, sm_90a, sm_110a) are built on the robot.
    try:
        rtx = providers.tensorrt_rtx()
    except providers.BuilderUnavailable:
        assert out.count("engines: none embedded") == 2
    else:
        assert out.count("engines: none embedded") == 1
        assert re.search(rf"part 'velocity'.*?\n    engine: TensorRT for RTX {rtx.version}, sm_80, [\d.]+ MiB\n"
                         rf"    engine: TensorRT for RTX {rtx.version}, sm_120, [\d.]+ MiB\n", out, re.S)
    assert "tokens 2..64..512" in out  # the decoder's dynamic token range
    # The precision the ONNX really carries: velocity fp16 (float32 islands, bf16 only at its boundary).
    assert re.search(r"part 'decoder'.*?precision in the ONNX: weights bf16 \d+, fp32 \d+; "
                     r"computed bf16 \d+, fp32 \d+; inputs/outputs bf16 2\n", out, re.S)
    assert re.search(r"part 'velocity'.*?precision in the ONNX: weights fp16 \d+, fp32 \d+; "
                     r"computed fp16 \d+, fp32 \d+; inputs/outputs bf16 4\n", out, re.S)


@pytest.mark.slow
def test_inspect_says_which_robot_gpus_each_partition_serves(example_pte, capsys):
    """The decoder names sm_87 and sm_110a in its kernel_archs, the velocity part takes the defaults:
    both carry a cubin for each Jetson."""
    code, out, _ = run(capsys, "inspect", example_pte)
    assert code == 0
    lines = re.findall(r"^    robot GPUs: (.*)$", out, re.M)
    assert lines == ["Jetson Orin (sm_87 cubin), Jetson Thor (sm_110a cubin)"] * 2, out


def _image(arch: str, fmt: str = "cubin", kernel: str = "grouped_mm_tile_nk", ptx_version: str = "8.0"):
    return KernelImage(kernel=kernel, variant=kernel.split("_")[2], trans_b=kernel.endswith("_nk"), arch=arch,
                       format=fmt, image=NamedData.of(b"\0"), entry=kernel, dtype="bf16", num_warps=8,
                       shared_bytes=0, global_scratch_bytes=0, global_scratch_align=1, profile_scratch_bytes=0,
                       block_m=128, block_n=128, block_k=32, persistent=False, ptx_version=ptx_version)


@pytest.mark.parametrize("images, orin, thor", [
    # The defaults, as the export compiles them: a cubin per architecture, then sm_80 PTX.
    ([_image(a) for a in DEFAULT_KERNEL_ARCHS] + [_image("sm_80", "ptx")], "sm_87 cubin", "sm_110a cubin"),
    # H100 only: the Jetsons fall back on the portable PTX.
    ([_image("sm_90a"), _image("sm_80", "ptx")], "PTX JIT from sm_80", "PTX JIT from sm_80"),
    # sm_80's cubin runs on sm_87 (same major); an arch-specific sm_100a cubin does not run on sm_110.
    ([_image("sm_80"), _image("sm_100a")], "sm_80 cubin", "not served: no image for it (add sm_110a to kernel_archs)"),
    # A kernel only PTX serves, beside cubins of another: both ways are named.
    ([_image("sm_87"), _image("sm_110a"), _image("sm_80", "ptx", kernel="grouped_mm_any_nk")],
     "sm_87 cubin + PTX JIT from sm_80", "sm_110a cubin + PTX JIT from sm_80"),
    # PTX of an ISA JetPack 6's driver does not know.
    ([_image("sm_80", "ptx", ptx_version="8.8")],
     "not served: PTX ISA 8.8 is newer than JetPack 6 (CUDA 12.6) JIT-compiles (8.5)", "PTX JIT from sm_80"),
])
def test_robot_gpus_follow_the_launchers_choice(images, orin, thor):
    assert robot_gpus_line(images) == f"Jetson Orin ({orin}), Jetson Thor ({thor})"


def test_a_partition_without_kernel_images_serves_every_robot_gpu():
    assert robot_gpus_line([]) == "Jetson Orin, Jetson Thor (no kernel images needed)"


@pytest.mark.slow
def test_dump_onnx_writes_each_partitions_model(example_pte, tmp_path, capsys):
    code, out, _ = run(capsys, "inspect", example_pte, "--dump-onnx", tmp_path / "onnx")
    assert code == 0
    dumped = sorted((tmp_path / "onnx").glob("*.onnx"))
    assert [p.name for p in dumped] == ["0_decoder.onnx", "1_velocity.onnx"]
    blobs = {p.contents.part: p.contents.onnx for p in read_partitions(example_pte.read_bytes())}
    for path in dumped:
        assert path.read_bytes() == blobs[path.stem.split("_", 1)[1]]
        onnx.checker.check_model(onnx.load(path))


@pytest.mark.slow
def test_check_passes_the_example_policy(example_pte, capsys):
    code, out, _ = run(capsys, "check", example_pte)
    assert code == 0, out
    assert "2 partition(s), 0 violation(s)" in out


@pytest.mark.slow
def test_check_build_parses_and_builds_each_partition_with_nvidias_builder(example_pte, capsys):
    try:
        rtx = providers.tensorrt_rtx()
    except providers.BuilderUnavailable as e:
        pytest.skip(f"needs TensorRT for RTX ({providers.RTX_EXTRA}): {e}")
    code, out, _ = run(capsys, "check", "--build", "--require-builder", example_pte)
    assert code == 0, out
    # The decoder's kernel_archs (sm_87, sm_90a, sm_110a) hold no RTX target: checked with an sm_80 build.
    assert re.search(rf"part 'decoder': ok\n    TensorRT for RTX {rtx.version}: kernel_archs \(sm_87, sm_90a, sm_110a\) "
                     rf"names no target TensorRT for RTX builds for; checked with an sm_80 build\n"
                     rf"    TensorRT for RTX {rtx.version}: built for sm_80 in [\d.]+ s \([\d.]+ MiB\)\n", out)
    assert re.search(rf"part 'velocity': ok\n    TensorRT for RTX {rtx.version}: built for sm_80 in .*\n"
                     rf"    TensorRT for RTX {rtx.version}: built for sm_120a in ", out)
    assert "2 partition(s), 0 violation(s), 0 build failure(s)" in out


@pytest.mark.slow
def test_check_build_without_a_builder_skips_or_fails_as_asked(example_pte):
    """As on a machine with neither TensorRT nor TensorRT for RTX (a process of its own: the builder keeps the
    providers it found)."""
    env = {**os.environ, "ET_TRT_TENSORRT_RTX_DIR": str(example_pte.parent / "no_tensorrt_rtx_here"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def check(*extra):
        return subprocess.run([sys.executable, "-m", "et_trt_partitioner.cli", "-q", "check", "--build", *extra,
                               str(example_pte)], capture_output=True, text=True, env=env, timeout=600)

    done = check()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "no NVIDIA builder installed: TensorRT is not installed here" in done.stdout, done.stdout
    assert "build check skipped (--require-builder makes this an error)" in done.stdout
    done = check("--require-builder")
    assert done.returncode == 1 and "no NVIDIA builder installed" in done.stdout, done.stdout
    assert ": an error (--require-builder)" in done.stdout


@pytest.mark.slow
def test_check_names_a_violating_node(example_pte, tmp_path, capsys):
    def add_unique(data: bytes) -> bytes:
        contents = blob.deserialize(data)
        model = onnx.load_from_string(contents.onnx)
        first_input = model.graph.input[0].name
        model.graph.node.append(helper.make_node("Unique", [first_input], ["injected"], name="injected_unique"))
        return blob.serialize(dataclasses.replace(contents, onnx=model.SerializeToString()))

    bad = tmp_path / "bad.pte"
    bad.write_bytes(damaged_pte.rewrite_blob(example_pte.read_bytes(), add_unique))
    code, out, _ = run(capsys, "check", bad)
    assert code == 1
    assert "[supported_ops] Unique node 'injected_unique'" in out and "1 violation(s)" in out


@pytest.mark.slow
def test_corrupted_blob_is_refused_naming_the_delegate(example_pte, tmp_path, capsys):
    def flip(data: bytes) -> bytes:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]

    bad = tmp_path / "corrupt.pte"
    bad.write_bytes(damaged_pte.rewrite_blob(example_pte.read_bytes(), flip))
    for command in ("inspect", "check"):
        code, out, err = run(capsys, command, bad)
        assert code == 1
        assert re.search(r"plan 'forward' delegate \d: blob crc32 mismatch", err), err


@pytest.mark.slow
def test_unparseable_onnx_in_a_valid_blob_is_reported(example_pte, tmp_path, capsys):
    def break_onnx(data: bytes) -> bytes:
        return blob.serialize(dataclasses.replace(blob.deserialize(data), onnx=b"\xff\xff not protobuf"))

    bad = tmp_path / "bad_onnx.pte"
    bad.write_bytes(damaged_pte.rewrite_blob(example_pte.read_bytes(), break_onnx))
    for command in ("inspect", "check"):
        code, _, err = run(capsys, command, bad)
        assert code == 1 and "the blob's ONNX does not parse" in err, err


@pytest.mark.slow
def test_delegates_are_read_with_executorch_and_match_the_blobs(example_pte):
    delegates = read_delegates(example_pte.read_bytes())
    assert [d.backend_id for d in delegates] == [BACKEND_ID, BACKEND_ID]
    for d in delegates:
        contents = blob.deserialize(d.data)
        assert d.compile_specs["et_trt.part"].decode() == contents.part


@pytest.mark.slow
def test_export_of_a_module_with_a_recipe(tmp_path, monkeypatch, capsys):
    """--module pkg.mod:factory and --recipe; the .pte is named after the module by default."""
    package = tmp_path / "site" / "my_robot"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "policies.py").write_text(
        "from support import moe_models\n"
        "def exported_moe():\n"
        "    return moe_models.export(moe_models.bf16(moe_models.GroupedMoE(experts=4)))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # support.moe_models
    recipe = tmp_path / "dense.toml"
    recipe.write_text("[default]\ngrouped_gemm_kernel = false\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "export", "--module", "my_robot.policies:exported_moe", "--recipe", recipe)
    assert code == 0
    assert out.startswith("policies.pte: ")
    [partition] = read_partitions((tmp_path / "policies.pte").read_bytes())
    assert partition.contents.options.grouped_gemm_kernel is False and partition.contents.kernels == []
    assert "kernel images: none" in out
    ops = onnx.load_from_string(partition.contents.onnx).graph.node
    assert not [n for n in ops if n.op_type == "GroupedMM"], "grouped_gemm_kernel = false lowers densely"


# ---- bad input ---------------------------------------------------------------------------
def test_not_a_pte(tmp_path, capsys):
    path = tmp_path / "x.pte"
    path.write_bytes(b"definitely not a program")
    code, _, err = run(capsys, "inspect", path)
    assert code == 1 and "not an ExecuTorch program" in err
    code, _, err = run(capsys, "check", tmp_path / "missing.pte")
    assert code == 2 and "no such file" in err


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_a_directory_is_named_as_one(tmp_path, capsys, command):
    (tmp_path / "policy.pte").write_bytes(b"")
    code, _, err = run(capsys, command, tmp_path)
    assert (code, err) == (2, f"et-trt {command}: {tmp_path}: is a directory, not a file; its .pte files: policy.pte\n")


def test_a_file_that_is_no_program_is_refused_before_torch_executorch_and_onnxscript_load(tmp_path):
    """inspect and check read the file first: the heavy imports come only for an ExecuTorch program."""
    wrong = tmp_path / "random.pte"
    wrong.write_bytes(random.randbytes(4096))
    code = ("import sys\nfrom et_trt_partitioner import cli\n"
            f"codes = [cli.main([command, {str(wrong)!r}]) for command in ('inspect', 'check')]\n"
            "print(codes, sorted(m for m in ('torch', 'executorch', 'onnxscript') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout == "[1, 1] []\n", result.stdout + result.stderr
    assert result.stderr.count("not an ExecuTorch program") == 2, result.stderr


@pytest.mark.parametrize("spec, words", [
    ("no_colon", "pkg.mod:factory"),
    ("missing_module_xyz:f", "cannot import missing_module_xyz"),
    ("/nonexistent/model.py:f", "no file"),
    ("json:not_there", "no callable 'not_there'"),
])
def test_bad_module_spec(spec, words, tmp_path, capsys):
    code, _, err = run(capsys, "export", "--module", spec, "--output", tmp_path / "x.pte")
    assert code == 2 and words in err
    assert not (tmp_path / "x.pte").exists()


def test_factory_must_return_an_exported_program(tmp_path, capsys):
    module = tmp_path / "factory.py"
    module.write_text("import torch\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    code, _, err = run(capsys, "export", "--module", f"{module}:make", "--output", tmp_path / "x.pte")
    assert code == 2 and "returned Linear" in err and "torch.export.ExportedProgram" in err
    assert not (tmp_path / "x.pte").exists()


def test_bad_recipe_is_refused_before_export(tmp_path, capsys):
    code, _, err = run(capsys, "export", "--recipe", tmp_path / "none.toml", "--output", tmp_path / "x.pte")
    assert code == 2 and "no such file" in err
    recipe = tmp_path / "bad.toml"
    recipe.write_text('[parts.decoder]\nprecison = "fp16"\n')
    code, _, err = run(capsys, "export", "--recipe", recipe, "--output", tmp_path / "x.pte")
    assert code == 1 and "precison" in err
    assert not (tmp_path / "x.pte").exists()


@pytest.mark.parametrize("kind", damaged_pte.KINDS)
@pytest.mark.parametrize("command", ["inspect", "check"])
def test_a_damaged_pte_is_refused_in_one_line(example_pte, tmp_path, capsys, command, kind):
    path = tmp_path / f"{kind}.pte"
    path.write_bytes(damaged_pte.damaged(example_pte.read_bytes(), kind, seed=random.randrange(1 << 30)))
    code, out, err = run(capsys, command, path)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.match(rf"et-trt {command}: (not an ExecuTorch program|truncated or corrupted ExecuTorch program"
                    r"|corrupted ExecuTorch program): ", err), err


def test_a_misspelled_part_is_refused_and_nothing_is_written(tmp_path, capsys):
    recipe = tmp_path / "typo.toml"
    recipe.write_text('[parts.decodr]\nprecision = "fp16"\n')
    code, _, err = run(capsys, "export", "--recipe", recipe, "--output", tmp_path / "x.pte")
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("et-trt export: recipe part 'decodr' (closest module paths: "
                                                      "'decoder'"), err
    assert list(tmp_path.iterdir()) == [recipe]


@pytest.mark.slow
def test_export_prints_only_et_trt_lines_unless_verbose(tmp_path):
    """Other libraries' INFO lines and warnings (onnx_ir, onnxscript, torchao, torch) stay out of
    the default output; -v shows them."""
    factory = tmp_path / "small.py"
    factory.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom support import moe_models\n"
        "def make():\n    return moe_models.export(moe_models.bf16(moe_models.GroupedMoE(experts=4)))\n")
    recipe = tmp_path / "dense.toml"
    recipe.write_text("[default]\ngrouped_gemm_kernel = false\n")

    def export(*flags):
        result = subprocess.run([sys.executable, "-m", "et_trt_partitioner.cli", *flags, "export", "--module",
                                 f"{factory}:make", "--recipe", str(recipe), "--output", str(tmp_path / "x.pte")],
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stderr.splitlines()

    log_line = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ [A-Z]+ (\S+): ")
    default = export()
    assert default and all(log_line.match(line) for line in default), "\n".join(default)
    assert {log_line.match(line)[1].split(".")[0] for line in default} == {"et_trt_backend", "et_trt_partitioner"}
    verbose = {m[1].split(".")[0] for m in map(log_line.match, export("-v")) if m}
    assert verbose - {"et_trt_backend", "et_trt_partitioner"}, "-v shows other libraries' logs too"
