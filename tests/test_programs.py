"""A .pte of several programs: examples/vla_policy.py's `prefix` and `denoise_step`, with one recipe.

One `et-trt export --module examples/vla_policy.py:export_programs --recipe examples/vla_recipe.toml
--external-data DIR` (the factory returns a dict of programs) serves the tests: each program takes its own
recipe table, the weights both programs use are stored once, `et-trt inspect` shows each program's
partitions, each program is one TensorRT engine, and NVIDIA's builder builds them. A recipe error about
any program is raised before anything is lowered.
"""

from __future__ import annotations

import collections
import hashlib
import sys
from pathlib import Path

import pytest
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._cord import Cord
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

from et_trt_backend import cli
from et_trt_backend.options import ShapeRange
from et_trt_backend.recipe import RecipeError
from et_trt_backend.serialization.pte import read_partitions, read_programs
from et_trt_partitioner import TensorRTPartitioner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vla_policy.py"
sys.path.insert(0, str(EXAMPLE.parent))
import vla_policy  # noqa: E402


@pytest.fixture(scope="module")
def vla_pte(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("vla")
    pte = folder / "vla.pte"
    assert cli.main(["-q", "export", "--module", f"{EXAMPLE}:export_programs", "--recipe",
                     str(ROOT / "examples" / "vla_recipe.toml"), "--output", str(pte), "--external-data",
                     str(folder)]) == 0
    return pte


def _by_program(pte: Path) -> dict[str, list]:
    by_program = collections.defaultdict(list)
    for partition in read_partitions(pte.read_bytes(), data_dir=pte.parent):
        by_program[partition.delegate.plan].append(partition.contents)
    return by_program


def test_each_program_is_one_engine(vla_pte):
    programs = {p.name: p for p in read_programs(vla_pte.read_bytes())}
    assert sorted(programs) == ["denoise_step", "prefix"]
    for program in programs.values():
        assert program.delegate_backends == ["EtTrtBackend"], program.name
        assert not program.kernel_calls, f"{program.name} leaves {dict(program.kernel_calls)} to ExecuTorch"


def test_each_program_takes_its_own_recipe_table(vla_pte):
    (prefix,), (step,) = _by_program(vla_pte)["prefix"], _by_program(vla_pte)["denoise_step"]
    assert (prefix.options.optimization_level, prefix.options.workspace_bytes) == (3, 2 << 30)
    assert (step.options.optimization_level, step.options.workspace_bytes) == (5, 1 << 30)
    assert prefix.options.shape_ranges == {"prompt": ShapeRange(1, 16, 48)}
    assert step.options.shape_ranges == {"context": ShapeRange(17, 32, 64)}
    assert prefix.options.kernel_archs == step.options.kernel_archs == ("sm_87", "sm_90a", "sm_110a", "sm_120a")


def test_weights_both_programs_use_are_stored_once(vla_pte):
    by_program = _by_program(vla_pte)
    keys = {name: {d.key for c in parts for d in c.named_data()} for name, parts in by_program.items()}
    shared = keys["prefix"] & keys["denoise_step"]
    # The backbone's weights of 1 KiB or more (the attention's q, kv and out, the router, the experts' gate_up
    # and down; the norms' are smaller and stay inside the ONNX), and the kernel images.
    assert len({w.data.key for c in by_program["prefix"] for w in c.weights} & shared) == 6
    assert {k.image.key for c in by_program["prefix"] for k in c.kernels} <= shared
    ptd = (vla_pte.parent / "vla.ptd").read_bytes()
    payload = FlatTensorSerializer().deserialize(Cord(ptd))
    in_ptd = {d.key for parts in by_program.values() for c in parts if c.data_file == "vla.ptd" for d in c.named_data()}
    assert set(payload.named_data) == in_ptd and shared <= in_ptd
    # One buffer per key, each key the sha256 of its bytes: equal bytes (the shared weights) once.
    assert len(payload.buffers) == len(payload.named_data)
    for key, entry in payload.named_data.items():
        assert key == "et_trt/" + hashlib.sha256(bytes(payload.buffers[entry.buffer_index])).hexdigest()


def test_inspect_shows_each_programs_partitions(vla_pte, capsys):
    assert cli.main(["inspect", str(vla_pte)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 TensorRT partition(s)\n")
    assert "program 'denoise_step': 1 TensorRT partition(s) [0]; ExecuTorch kernels: none\n" in out
    assert "program 'prefix': 1 TensorRT partition(s) [1]; ExecuTorch kernels: none\n" in out
    assert "[0] part 'default': plan 'denoise_step' delegate 0" in out


def test_check_build_passes(vla_pte, capsys):
    assert cli.main(["check", "--build", "--require-builder", str(vla_pte)]) == 0, capsys.readouterr().out


def test_a_part_no_program_holds_is_refused_before_anything_is_lowered():
    # `vision` is in the prefix only: fine. The misspelt part and the part named for the wrong program are not.
    recipe = {"parts": {"vision": {}, "visoin": {}}, "programs": {"prefix": {"parts": {"time_mlp": {}}}}}
    with pytest.raises(RecipeError) as error:
        to_edge_transform_and_lower(vla_policy.export_programs(), partitioner=[TensorRTPartitioner(recipe)])
    assert str(error.value).startswith(
        "recipe parts 'visoin' (closest module paths: 'vision'), 'time_mlp' of program 'prefix' match no module "
        "of the exported programs 'prefix', 'denoise_step'")


@pytest.mark.parametrize("returned, message", [
    ("{'prefix': 3}", "returned a dict with 'prefix': int; it must return a torch.export.ExportedProgram"),
    ("{}", "returned an empty dict"),
    ("[1]", "returned list"),
])
def test_export_refuses_a_factory_returning_no_programs(tmp_path, capsys, returned, message):
    factory = tmp_path / "factory.py"
    factory.write_text(f"def programs():\n    return {returned}\n")
    assert cli.main(["export", "--module", f"{factory}:programs", "--output", str(tmp_path / "x.pte")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.pte").exists()
