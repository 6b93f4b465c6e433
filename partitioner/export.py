"""export(): torch.export programs to a .pte with TensorRT partitions, as `et-trt export` does it.

torch, ExecuTorch and the lowering are imported when export() runs, not with this module, so that the
et-trt command starts without them.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)


class UsageError(ValueError):
    """A bad argument or input file: the message says what is wrong and the fix (the et-trt command prints it
    without a traceback)."""


def require_file(path: Path, what: str, suffix: str = "") -> None:
    """UsageError unless `path` is a file; a folder is named as one, with its `suffix` files as the hint."""
    name = f"{what} {path}" if what else str(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob(f"*{suffix}") if p.is_file()) if suffix else []
        raise UsageError(f"{name}: is a directory, not a file"
                         + (f"; its {suffix} files: {', '.join(found[:5])}" if found else ""))
    if not path.is_file():
        raise UsageError(f"{name}: no such file")


def export(factory: Callable[[], Any], recipe: Path | None, output: Path, name: str = "",
           data_dir: Path | None = None) -> dict[str, Any]:
    """Export the program (or dict of programs) `factory` returns to `output`, its TensorRT partitions' weights,
    kernel images and engines into `data_dir`/<output stem>.ptd if given (else into the .pte); returns step
    timings, sizes and the export report (et_trt_backend.export_report: per program, what TensorRT runs and what
    not, and why)."""
    if recipe is not None:
        require_file(recipe, "--recipe")
    tag = file_safe(output.stem)
    if data_dir is not None:
        refuse_data_file_clash(data_dir / f"{tag}.ptd", output)
    logger.info("importing ExecuTorch and the lowering")
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_backend.export_report import report
    from et_trt_partitioner import TensorRTPartitioner

    # validates the recipe first
    partitioner = TensorRTPartitioner(str(recipe) if recipe else None, preserved_ops_in_config=True)
    timings = {}
    start = time.perf_counter()
    name = name or getattr(factory, "__name__", "the factory")
    logger.info("exporting the program(s) from %s", name)
    programs = _programs_of(factory(), name)
    timings["torch_export_s"] = time.perf_counter() - start
    if data_dir is not None:
        from et_trt_backend.serialization import external_data

        for program in programs.values():  # one .ptd: weights the programs share are stored once
            external_data.tag_weights(program, tag)

    step = time.perf_counter()
    logger.info("partitioning and lowering %s with recipe %s", ", ".join(programs), recipe or "(defaults)")
    edge = to_edge_transform_and_lower(programs, partitioner=[partitioner],
                                       compile_config=TensorRTPartitioner.edge_compile_config())
    exported = report(edge)  # before to_executorch(), which turns the ops left out into their out variants
    timings["lower_s"] = time.perf_counter() - step

    step = time.perf_counter()
    logger.info("writing the ExecuTorch program")
    executorch_program = edge.to_executorch()
    written = write_program(executorch_program, output, data_dir)
    timings["to_executorch_s"] = time.perf_counter() - step
    timings["total_s"] = time.perf_counter() - start
    for path in written:
        logger.info("wrote %s", path)
    logger.info("exported in %.1f s", timings["total_s"])
    data_files = [path for path in written if path != output]
    return {**timings, "pte_bytes": output.stat().st_size, "data_files": data_files, "report": exported}


def refuse_data_file_clash(data_file: Path, output: Path) -> None:
    """UsageError where `data_file` exists but is not the data file of the .pte at `output` (which the export
    replaces with its own): writing it would destroy another export's weights."""
    if not data_file.exists() or data_file.name in _data_files_named_by(output):
        return
    raise UsageError(
        f"{data_file} exists and is not the data file of {output}: another export wrote it, and this one would "
        f"overwrite its weights. Choose another output name (the data file is named after it) or folder, or remove "
        f"{data_file} first")


def _data_files_named_by(pte: Path) -> set[str]:
    """The data files (.ptd) the TensorRT partitions of the .pte at `pte` name; none if it is no readable .pte."""
    from et_trt_backend.serialization.blob import BlobError
    from et_trt_backend.serialization.pte import read_partitions
    from et_trt_backend.serialization.pte_header import PteError

    try:
        return {p.contents.data_file for p in read_partitions(pte.read_bytes(), missing_data_ok=True)}
    except (OSError, PteError, BlobError):
        return set()


def _programs_of(returned: Any, name: str) -> dict[str, Any]:
    """The programs a factory returned, by name: one ExportedProgram (ExecuTorch names it "forward") or a
    dict of them (the .pte's methods, e.g. {"prefix": ..., "denoise_step": ...})."""
    import torch

    programs = returned if isinstance(returned, dict) else {"forward": returned}
    wrong = {key: type(value).__name__ for key, value in programs.items()
             if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, torch.export.ExportedProgram)}
    if not programs or wrong:
        got = type(returned).__name__ if not isinstance(returned, dict) else (
            f"a dict with {', '.join(f'{k!r}: {v}' for k, v in wrong.items())}" if wrong else "an empty dict")
        raise UsageError(
            f"{name} returned {got}; it must return a torch.export.ExportedProgram (call "
            "torch.export.export(model, example_inputs, dynamic_shapes=...) in it) or a dict of method name "
            "(a Python identifier) -> ExportedProgram, one per method of the .pte")
    return programs


def write_program(executorch_program, output: Path, data_dir: Path | None) -> list[Path]:
    """Writes the .pte to `output` and its data files (.ptd) to `data_dir`; returns the paths. Each is
    written beside its target, then renamed: never half a file, nor a .pte without its data files."""
    output.parent.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".et-trt-partial-") as partial:
        partial = Path(partial)
        targets = []
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
            executorch_program.write_tensor_data_to_file(str(partial))
            targets = [(path, data_dir / path.name) for path in sorted(partial.iterdir())]
        with open(partial / output.name, "wb") as f:
            executorch_program.write_to_file(f)
        targets.append((partial / output.name, output))
        for source, target in targets:
            shutil.move(source, target)
            written.append(target)
    return written


def file_safe(name: str) -> str:
    """`name` as a file name: letters (of any script), digits, "_", "." and "-" kept, other runs as "_"."""
    return re.sub(r"[^\w.-]+", "_", name)
