"""A .pte of several programs: examples/vla_policy.py's `prefix` and `denoise_step`, with one recipe.

The README's two-program snippet (section "A policy of several programs") exports the example once for
these tests: each program is one TensorRT engine and takes its own recipe table, the weights both programs
use are stored once, `et-trt inspect` shows each program's partitions, and NVIDIA's builder builds them.
`et-trt export` takes a factory returning a dict of programs (a tiny one, with its weights in a .ptd). A
recipe error about any program is raised before anything is lowered.
"""

from __future__ import annotations

import collections
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._cord import Cord
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

from et_trt_backend import BACKEND_ID, runtime
from et_trt_backend.options import ShapeRange
from et_trt_backend.recipe import RecipeError
from et_trt_backend.serialization.pte import read_partitions, read_plans
from et_trt_partitioner import TensorRTPartitioner, cli

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import vla_policy  # noqa: E402


@pytest.fixture(scope="module")
def vla_pte(tmp_path_factory) -> Path:
    """The README's snippet, run as written from a folder holding the examples."""
    section = (ROOT / "README.md").read_text().split("## A policy of several programs", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    folder = tmp_path_factory.mktemp("vla")
    (folder / "examples").symlink_to(ROOT / "examples")
    result = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "vla_policy.pte"


def _stored_once(buffers, entries) -> None:
    """Each named data key is the sha256 of its bytes, and each key has a buffer of its own: equal bytes once."""
    assert len(buffers) == len(entries)
    for key, entry in entries.items():
        assert key == "et_trt/" + hashlib.sha256(bytes(buffers[entry.buffer_index])).hexdigest()


def _by_program(pte: Path) -> dict[str, list]:
    by_program = collections.defaultdict(list)
    for partition in read_partitions(pte.read_bytes(), data_dir=pte.parent):
        by_program[partition.delegate.plan].append(partition.contents)
    return by_program


def test_each_program_is_one_engine(vla_pte):
    plans = {p.name: p for p in read_plans(vla_pte.read_bytes())}
    assert sorted(plans) == ["denoise_step", "prefix"]
    by_program = _by_program(vla_pte)
    for name, plan in plans.items():
        assert plan.delegate_calls == len(by_program[name]) == 1, name
        assert not plan.kernel_calls, f"{name} leaves {dict(plan.kernel_calls)} to ExecuTorch"


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
    named_data = deserialize_pte_binary(vla_pte.read_bytes()).named_data
    assert set(named_data.pte_data) == keys["prefix"] | keys["denoise_step"]
    _stored_once(named_data.buffers, named_data.pte_data)


def test_inspect_shows_each_programs_partitions(vla_pte, capsys):
    assert cli.main(["inspect", str(vla_pte)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 TensorRT partition(s)\n")
    none = "1 delegate call(s); ops outside the delegates (ExecuTorch's kernels): none"
    assert f"plan 'denoise_step': {none}; TensorRT partitions [0]\n" in out
    assert f"plan 'prefix': {none}; TensorRT partitions [1]\n" in out
    assert "[0] part 'default': plan 'denoise_step' delegate 0" in out


def test_check_build_passes(vla_pte, capsys):
    assert cli.main(["check", "--build", "--require-builder", str(vla_pte)]) == 0, capsys.readouterr().out


def test_executorch_loads_each_program_up_to_tensorrt(built_runtime, vla_pte, capfd):
    # Each method's delegate finds its blob and named data; this runtime build has no TensorRT layer, so
    # init stops there, in both programs (running them needs TensorRT and a GPU).
    from executorch.runtime import Runtime

    runtime.load()
    program = Runtime.get().load_program(vla_pte)
    assert program.method_names == {"prefix", "denoise_step"}
    for name in sorted(program.method_names):
        with pytest.raises(Exception):
            program.load_method(name)
    err = capfd.readouterr().err
    assert err.count(f"{BACKEND_ID}: cannot initialize part") == 2, err[-3000:]
    assert "TensorRT support was not built into libet_trt_runtime.so" in err, err[-3000:]


def test_a_part_no_program_holds_is_refused_before_anything_is_lowered():
    # `vision` is in the prefix only: fine. The misspelt part and the part named for the wrong program are not.
    recipe = {"parts": {"vision": {}, "visoin": {}}, "programs": {"prefix": {"parts": {"time_mlp": {}}}}}
    with pytest.raises(RecipeError) as error:
        to_edge_transform_and_lower(vla_policy.export_programs(), partitioner=[TensorRTPartitioner(recipe)])
    assert str(error.value).startswith(
        "recipe parts 'visoin' (closest module paths: 'vision'), 'time_mlp' of program 'prefix' match no module "
        "of the exported programs 'prefix', 'denoise_step'")


TWO_PROGRAMS = """
import torch

shared = torch.nn.Linear(64, 64)


class Relu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = shared

    def forward(self, x):
        return torch.relu(self.shared(x))


def programs():
    x = torch.randn(4, 64)
    return {"project": torch.export.export(shared, (x,)), "relu": torch.export.export(Relu(), (x,))}
"""


def test_export_takes_a_dict_of_programs_and_stores_shared_weights_once(tmp_path, capsys):
    factory = tmp_path / "two.py"
    factory.write_text(TWO_PROGRAMS)
    pte = tmp_path / "two.pte"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[default]\nprecision = "fp32"\nengine_build = "never"\n\n[programs.relu.default]\n'
                      "optimization_level = 5\n")
    assert cli.main(["export", "--module", f"{factory}:programs", "--recipe", str(recipe), "--output", str(pte),
                     "--external-data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    none = "1 delegate call(s); ops outside the delegates (ExecuTorch's kernels): none"
    assert f"plan 'project': {none}; TensorRT partitions [0]\n" in out
    assert f"plan 'relu': {none}; TensorRT partitions [1]\n" in out
    by_program = _by_program(pte)
    (project,), (relu,) = by_program["project"], by_program["relu"]
    assert (project.options.optimization_level, relu.options.optimization_level) == (3, 5)
    assert project.data_file == relu.data_file == "two.ptd"
    assert {w.data.key for w in project.weights} == {w.data.key for w in relu.weights}  # the Linear's weight
    payload = FlatTensorSerializer().deserialize(Cord((tmp_path / "two.ptd").read_bytes()))
    assert set(payload.named_data) == {w.data.key for w in project.weights}
    _stored_once(payload.buffers, payload.named_data)


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
