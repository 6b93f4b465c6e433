"""export(): a torch.export program to a .pte with TensorRT partitions, as `et-trt export` does it.

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


def export(factory: Callable[[], Any], recipe: Path | None, output: Path, name: str = "",
           data_dir: Path | None = None) -> dict[str, Any]:
    """Export the program `factory` returns to `output`, its TensorRT partitions' weights, kernel images and
    engines into `data_dir`/<output stem>.ptd if given (else into the .pte); returns step timings and sizes."""
    if recipe is not None and not recipe.is_file():
        raise UsageError(f"--recipe {recipe}: no such file")
    logger.info("importing ExecuTorch and the lowering")
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from et_trt_partitioner import TensorRTPartitioner

    partitioner = TensorRTPartitioner(str(recipe) if recipe else None)  # validates the recipe first
    timings = {}
    start = time.perf_counter()
    name = name or getattr(factory, "__name__", "the factory")
    logger.info("exporting the program from %s", name)
    program = factory()
    if not isinstance(program, torch.export.ExportedProgram):
        raise UsageError(
            f"{name} returned {type(program).__name__}; it must return a torch.export.ExportedProgram "
            "(call torch.export.export(model, example_inputs, dynamic_shapes=...) in it)"
        )
    timings["torch_export_s"] = time.perf_counter() - start
    if data_dir is not None:
        from et_trt_backend.serialization import external_data

        external_data.tag_weights(program, file_safe(output.stem))

    step = time.perf_counter()
    logger.info("partitioning and lowering with recipe %s", recipe or "(defaults)")
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
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
    return {**timings, "pte_bytes": output.stat().st_size, "data_files": data_files}


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
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
