"""What an export tells its user: every op left to ExecuTorch with its reason and source line (a WARNING record
from Python, export()'s report, `et-trt inspect`), other libraries' log lines held back, and the data file
named after the .pte with its letters kept, never overwriting another export's."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from et_trt_backend.export_report import is_op
from et_trt_partitioner import cli
from et_trt_partitioner.export import UsageError, export, file_safe
from et_trt_partitioner.log_config import OWN_LOGGERS

FLOAT64_LINE = "z = (y.double() * 2).to(y.dtype)"
# No engines at export: the summary does not depend on them, and the test stays quick. float64 kept as float64
# (truncate_double = false): a step that cannot run in TensorRT, so the export has a fallback to report.
RECIPE = "[default]\nengine_build = \"never\"\ntruncate_double = false\n"
RECIPE_DICT = {"default": {"engine_build": "never", "truncate_double": False}}


class PaddedMishHead(torch.nn.Module):
    """An action head as users write them: Mish, a padded sequence, and a float64 step (kept in float64 by the
    tests' recipe, so TensorRT cannot hold it)."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)  # 8 KiB: named data, not inline

    def forward(self, x):
        y = F.mish(self.lin(x))
        y = F.pad(y, (0, 0, 0, 2))
        z = (y.double() * 2).to(y.dtype)
        return self.out(z)


def export_head() -> torch.export.ExportedProgram:
    head = PaddedMishHead().to(torch.bfloat16).eval()
    return torch.export.export(head, (torch.randn(4, 64, dtype=torch.bfloat16),))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export() result, its .pte, every log record at INFO and above): the head exported with its weights in a
    .ptd named after a non-ASCII .pte, the root logger at INFO as `logging.basicConfig(level=INFO)` sets it."""
    folder = tmp_path_factory.mktemp("summary")
    recipe = folder / "recipe.toml"
    recipe.write_text(RECIPE)
    root, records = logging.getLogger(), _Records()
    # Our loggers as a fresh process has them (unset): an in-process `et-trt -q` of another test sets them.
    own = {name: logging.getLogger(name).level for name in OWN_LOGGERS}
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(records)
    for name in own:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        result = export(export_head, recipe, folder / "политика_v2.pte", data_dir=folder)
    finally:
        root.removeHandler(records)
        root.setLevel(level)
        for name, own_level in own.items():
            logging.getLogger(name).setLevel(own_level)
    return result, folder / "политика_v2.pte", records.records


def _source_line(code: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.strip() == code)
    return f"{__file__}:{number} (forward): {code}"


def test_the_report_names_every_op_left_out_with_its_reason_and_source_line(exported):
    result, _, _ = exported
    (program,) = result["report"]
    assert program.method == "forward" and program.partitions >= 1 and program.ops_delegated > 0
    # The float64 multiplication runs in ExecuTorch, for the dtype rule's reason, at its line of this file.
    mul = next(e for e in program.left_out if e.op == "aten.mul.Tensor")
    assert mul.source == _source_line(FLOAT64_LINE)
    assert mul.reason.startswith("tensor of dtype float64, which TensorRT lacks; set truncate_double = true")
    for entry in program.left_out:
        assert entry.reason and entry.source.startswith(f"{__file__}:"), entry
    assert sum(e.count for e in program.left_out) == _ops_outside_delegates(export_head())


def _ops_outside_delegates(program: torch.export.ExportedProgram) -> int:
    """The ops a fresh lowering of `program` leaves in the top-level graph (outside every delegate)."""
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_partitioner import TensorRTPartitioner

    edge = to_edge_transform_and_lower(program, partitioner=[TensorRTPartitioner(RECIPE_DICT)])
    return sum(map(is_op, edge.exported_program().graph.nodes))


def test_python_shows_the_fallbacks_at_warning(exported):
    """A WARNING record: Python prints it with no logging configured."""
    result, _, records = exported
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING and r.name.startswith("et_trt")]
    assert len(warnings) == 1, warnings
    for entry in result["report"][0].left_out:
        assert f"  {entry}" in warnings[0].splitlines()


def test_a_python_export_with_no_logging_set_up_prints_the_fallbacks_and_nothing_else():
    """As a user's script runs it: to_edge_transform_and_lower, logging untouched."""
    script = ("import sys\n"
              f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from executorch.exir import to_edge_transform_and_lower\n"
              "from et_trt_partitioner import TensorRTPartitioner\n"
              "import test_export_summary as t\n"
              "to_edge_transform_and_lower(t.export_head(), partitioner=[TensorRTPartitioner(t.RECIPE_DICT)])\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^TensorRTPartitioner: \d+ op\(s\) left to ExecuTorch, outside TensorRT:$", result.stderr, re.M)
    assert f"  aten.mul.Tensor at {_source_line(FLOAT64_LINE)}: tensor of dtype float64" in result.stderr
    # torch.onnx's warnings (torchvision ops it cannot register) are held back; importing ExecuTorch still warns.
    assert "torchvision is not installed" not in result.stderr, result.stderr


def test_other_libraries_info_lines_are_held_back(exported):
    _, _, records = exported
    names = {r.name.partition(".")[0] for r in records}
    assert {"et_trt_backend", "et_trt_partitioner"} <= names
    assert not names & {"onnxscript", "onnx_ir", "torch"}, [r.getMessage() for r in records
                                                           if not r.name.startswith("et_trt")][:5]


def test_inspect_lists_the_ops_outside_the_delegates(exported, capsys):
    _, pte, _ = exported
    assert cli.main(["-q", "inspect", str(pte)]) == 0
    plan = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plan 'forward': "))
    assert "delegate call(s); ops outside the delegates (ExecuTorch's kernels): " in plan
    assert "aten::mul.out 1" in plan, plan


def test_the_data_file_keeps_the_letters_of_its_name(exported):
    _, pte, _ = exported
    assert (pte.parent / "политика_v2.ptd").is_file()
    assert file_safe("политика_v2") != file_safe("стратегия_v2")


def test_another_exports_data_file_is_never_overwritten(exported):
    _, pte, _ = exported
    data_file = pte.parent / "политика_v2.ptd"
    weights = data_file.read_bytes()

    def not_called():
        raise AssertionError("the export should have been refused before exporting")

    other = pte.parent / "other" / "политика_v2.pte"
    with pytest.raises(UsageError, match=re.escape(f"{data_file} exists and is not the data file of {other}")):
        export(not_called, None, other, data_dir=pte.parent)
    assert data_file.read_bytes() == weights


def test_exporting_again_replaces_its_own_data_file(exported):
    """The .pte being replaced names the data file: exporting the same program again is no clash."""
    _, pte, _ = exported
    again = export(export_head, pte.parent / "recipe.toml", pte, data_dir=pte.parent)
    assert again["data_files"] == [pte.parent / "политика_v2.ptd"]
