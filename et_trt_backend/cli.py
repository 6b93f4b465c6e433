"""The `et-trt` command: export a policy to a .pte, inspect one, pre-flight check one.

    et-trt export [--module pkg.mod:factory | file.py:factory] [--recipe FILE] [--output PATH] [--external-data DIR]
    et-trt inspect FILE.pte [--data FILE.ptd] [--dump-onnx DIR]
    et-trt check FILE.pte [--data FILE.ptd] [--build [--require-builder] [--plugin-library PATH]]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import logging
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from et_trt_backend import log_config

logger = logging.getLogger(__name__)

# The example policy and recipe: et_trt_backend/examples in an installed package (`pip install .`
# ships them there), else examples/ of the source checkout the package is imported from.
_PACKAGED_EXAMPLES = Path(__file__).resolve().parent / "examples"
EXAMPLES_DIR = _PACKAGED_EXAMPLES if _PACKAGED_EXAMPLES.is_dir() else Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_MODULE = f"{EXAMPLES_DIR / 'moe_policy.py'}:export_policy"
EXAMPLE_RECIPE = EXAMPLES_DIR / "recipe.toml"


class UsageError(Exception):
    """A bad argument or input file; printed without a traceback."""


# ---- export ------------------------------------------------------------------
def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by "pkg.mod:name" or "path/to/file.py:name"."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--module {spec!r}: write it as pkg.mod:factory or path/to/file.py:factory")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise UsageError(f"--module {spec!r}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module  # dataclasses and pickling look modules up by name
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise UsageError(f"--module {spec!r}: cannot import {module_name} ({e}); is it on PYTHONPATH?") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"--module {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def export(factory: Callable[[], Any], recipe: Path | None, output: Path, name: str = "",
           data_dir: Path | None = None) -> dict[str, Any]:
    """Export the program `factory` returns to `output`, its TensorRT partitions' weights, kernel images and
    engines into `data_dir`/<output stem>.ptd if given (else into the .pte); returns step timings and sizes."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    import et_trt_backend.backend  # noqa: F401  (ExecuTorch finds EtTrtBackend by class name)
    from et_trt_partitioner import TensorRTPartitioner

    if recipe is not None and not recipe.is_file():
        raise UsageError(f"--recipe {recipe}: no such file")
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

        external_data.tag_weights(program, _file_safe(output.stem))

    step = time.perf_counter()
    logger.info("partitioning and lowering with recipe %s", recipe or "(defaults)")
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
    timings["lower_s"] = time.perf_counter() - step

    step = time.perf_counter()
    logger.info("writing the ExecuTorch program")
    executorch_program = edge.to_executorch()
    written = _write_program(executorch_program, output, data_dir)
    timings["to_executorch_s"] = time.perf_counter() - step
    timings["total_s"] = time.perf_counter() - start
    for path in written:
        logger.info("wrote %s (%s)", path, _size(path.stat().st_size))
    logger.info("exported in %.1f s", timings["total_s"])
    data_files = [path for path in written if path != output]
    return {**timings, "pte_bytes": output.stat().st_size, "data_files": data_files}


def _write_program(executorch_program, output: Path, data_dir: Path | None) -> list[Path]:
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


def _cmd_export(args: argparse.Namespace) -> int:
    module = args.module or EXAMPLE_MODULE
    recipe = args.recipe
    if recipe is None and args.module is None and EXAMPLE_RECIPE.is_file():
        recipe = EXAMPLE_RECIPE
    if args.module is None and not EXAMPLES_DIR.is_dir():
        raise UsageError(f"the example policy ships with the source tree ({EXAMPLES_DIR}); pass --module")
    source = module.rpartition(":")[0]
    output = args.output or Path((Path(source).stem if source.endswith(".py") else source.rpartition(".")[2]) + ".pte")
    result = export(load_factory(module), recipe, output, name=module, data_dir=args.external_data)
    data = "".join(f", {path} {_size(path.stat().st_size)}" for path in result["data_files"])
    print(f"{output}: {_size(result['pte_bytes'])}{data}, exported in {result['total_s']:.1f} s")
    _print_summary(output, result["data_files"])
    return 0


# ---- inspect -------------------------------------------------------------------
def _cmd_inspect(args: argparse.Namespace) -> int:
    partitions = _print_summary(args.file, args.data, detail=True)
    if args.dump_onnx is not None:
        _dump_onnx(partitions, args.dump_onnx)
    return 0


def _dump_onnx(partitions, folder: Path) -> None:
    """Each partition's ONNX, its weights beside it as ONNX external data (their locations), for trtexec or
    Polygraphy."""
    from et_trt_backend.serialization.blob import BlobError

    folder.mkdir(parents=True, exist_ok=True)
    for i, partition in enumerate(partitions):
        contents = partition.contents
        path = folder / f"{i}_{_file_safe(contents.part or 'partition')}.onnx"
        for weight in contents.weights:
            if weight.data.data is None:
                raise BlobError(f"part {contents.part!r}: its weights are in '{contents.data_file}', which was not "
                                "found: pass it with --data")
            location = folder / weight.data.key
            location.parent.mkdir(parents=True, exist_ok=True)
            location.write_bytes(weight.data.data)
        path.write_bytes(contents.onnx)
        print(f"wrote {path}" + (f" and {len(contents.weights)} weight file(s) under {folder}" if contents.weights
                                 else ""))


def _partitions(pte: Path, data_files: list[Path] | None, missing_data_ok: bool = False) -> list:
    """The .pte's TensorRT partitions, their named data read from the .pte and `data_files` (--data), else from
    the data files they name beside the .pte."""
    from et_trt_backend.serialization.pte import read_partitions

    for path in data_files or []:
        if not path.is_file():
            raise UsageError(f"--data {path}: no such file")
    return read_partitions(_read_pte(pte), data_files or (), data_dir=pte.parent, missing_data_ok=missing_data_ok)


def _print_summary(pte: Path, data_files: list[Path] | None = None, detail: bool = False) -> list:
    from et_trt_backend import BACKEND_ID
    from et_trt_backend.serialization.pte import read_delegates

    others = collections.Counter(d.backend_id for d in read_delegates(_read_pte(pte)) if d.backend_id != BACKEND_ID)
    partitions = _partitions(pte, data_files, missing_data_ok=True)
    print(f"{len(partitions)} TensorRT partition(s)"
          + (f"; other delegates: {dict(others)}" if others else ""))
    for i, partition in enumerate(partitions):
        _print_partition(i, partition, detail)
    return partitions


def _print_partition(i: int, partition, detail: bool) -> None:
    from et_trt_backend.kernels.robot_gpus import robot_gpus_line
    from et_trt_backend.serialization.blob import PROVIDERS

    c, d = partition.contents, partition.delegate
    print(f"\n[{i}] part {c.part!r}: plan '{d.plan}' delegate {d.index}, blob {_size(len(d.data))}, "
          f"content id {partition.header.content_id[:16]}")
    for kind, specs in (("inputs", c.inputs), ("outputs", c.outputs)):
        print(f"    {kind}:")
        for spec in specs:
            print(f"      {spec.name}: {str(spec.dtype).removeprefix('torch.')} [{_dims(spec.dims)}]")
    model = load_onnx(partition)
    ops, opset = _onnx_ops(model)
    print(f"    ONNX: {_size(len(c.onnx))}, opset {opset}, {sum(ops.values())} nodes: "
          + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
    home = c.data_file or "the .pte"
    found = "" if partition.missing_data is None else f", NOT FOUND ({partition.missing_data})"
    print(f"    weights: {len(c.weights)} external, {_size(sum(w.data.size for w in c.weights))}, named data in "
          f"{home}{found}")
    print("    precision in the ONNX: " + "; ".join(
        f"{kind} " + ", ".join(f"{t} {n}" for t, n in counts.items())
        for kind, counts in onnx_precision(model).items() if counts))
    print("    " + _fp8_line(model))
    options = c.options.to_json()
    if detail:
        print(f"    options: {json.dumps(options, sort_keys=True)}")
    else:
        print(f"    options: precision {options['precision']}, engine_build {options['engine_build']}")
    if not c.kernels:
        print("    kernel images: none (no GroupedMM, or the grouped-GEMM kernel is off)")
    elif detail:
        print(f"    kernel images ({len(c.kernels)}):")
        for k in c.kernels:
            print(f"      {k.arch:8} {k.format:5} {k.kernel} {k.dtype} {_size(k.image.size)}, {k.num_warps} warps, "
                  f"{k.shared_bytes} B shared, tile {k.block_m}x{k.block_n}x{k.block_k}"
                  f"{', persistent' if k.persistent else ''}{', PTX ' + k.ptx_version if k.ptx_version else ''}")
    else:
        archs = {fmt: sorted({k.arch for k in c.kernels if k.format == fmt}, key=_arch_number)
                 for fmt in ("cubin", "ptx")}
        print(f"    kernel images: {len(c.kernels)}, {_size(sum(k.image.size for k in c.kernels))}; "
              + "; ".join(f"{fmt} {', '.join(a)}" for fmt, a in archs.items() if a))
    print(f"    robot GPUs: {robot_gpus_line(c.kernels)}")
    if not c.engines:
        print("    engines: none embedded; the robot builds one from the ONNX at first load (then caches it)")
    for e in c.engines:
        built_on = f", built on {e.gpu_name}" if e.gpu_name else ""
        print(f"    engine: {PROVIDERS[e.provider]} {e.tensorrt_version}, sm_{e.compute_capability}{built_on}, "
              f"{_size(e.plan.size)}")
        for note in e.options_not_applied:
            print(f"      not applied: {note}")
    if detail:
        print("    producer: " + ", ".join(f"{k} {v}" for k, v in c.producer.items() if v not in ("", 0)))


def load_onnx(partition):
    """The partition's ONNX model; BlobError if the blob's ONNX bytes do not parse."""
    import onnx

    from et_trt_backend.serialization.blob import BlobError

    try:
        return onnx.load_from_string(partition.contents.onnx)
    except Exception as e:  # protobuf raises DecodeError and others
        raise BlobError(f"part {partition.contents.part!r}: the blob's ONNX does not parse ({e})") from e


def _onnx_ops(model) -> tuple[collections.Counter, int | None]:
    ops = collections.Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph.node
    )
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), None)
    return ops, opset


def onnx_precision(model) -> dict[str, dict[str, int]]:
    """The floating types the ONNX really holds (what the engine computes in, TensorRT networks being
    strongly typed): for its weights (initializers), the values its nodes compute and its inputs and
    outputs, how many tensors of each type."""
    from onnx import TensorProto

    names = {TensorProto.BFLOAT16: "bf16", TensorProto.FLOAT16: "fp16", TensorProto.FLOAT: "fp32",
             TensorProto.DOUBLE: "fp64"}
    graph = model.graph

    def count(types) -> dict[str, int]:  # in the order of `names`
        counted = collections.Counter(types)
        return {name: counted[t] for t, name in names.items() if counted[t]}

    return {
        "weights": count(t.data_type for t in graph.initializer),
        "computed": count(v.type.tensor_type.elem_type for v in graph.value_info),
        "inputs/outputs": count(v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]),
    }


def fp8_grouped_mms(model) -> list[dict]:
    """The ONNX's FP8 GroupedMMs (4 inputs: b_scale), each with its node name, weights and their bytes, and
    whether it takes a gate+up output and computes its SwiGLU (activation 1)."""
    from et_trt_backend.plugin_names import ACTIVATION_ATTRIBUTE, ACTIVATIONS, GROUPED_MM_DOMAIN, GROUPED_MM_OP

    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if (node.domain, node.op_type) != (GROUPED_MM_DOMAIN, GROUPED_MM_OP) or len(node.input) != 4:
            continue
        shape = dims.get(node.input[1], [])
        activation = next((a.i for a in node.attribute if a.name == ACTIVATION_ATTRIBUTE), ACTIVATIONS["none"])
        found.append({"node": node.name, "weights": node.input[1], "shape": shape,
                      "weights_bytes": math.prod(shape), "scales_bytes": 4 * math.prod(dims.get(node.input[3], [])),
                      "swiglu": activation == ACTIVATIONS["swiglu"]})
    return found


def _fp8_line(model) -> str:
    """Which GroupedMMs of the partition have FP8 weights, and their bytes."""
    from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN, GROUPED_MM_OP

    total = sum((n.domain, n.op_type) == (GROUPED_MM_DOMAIN, GROUPED_MM_OP) for n in model.graph.node)
    fp8 = fp8_grouped_mms(model)
    if not fp8:
        return f"FP8 experts: none ({total} GroupedMM in the part's precision)"
    return (f"FP8 experts: {len(fp8)} of {total} GroupedMM, weights {_size(sum(e['weights_bytes'] for e in fp8))} "
            f"e4m3 + {_size(sum(e['scales_bytes'] for e in fp8))} scales: "
            + ", ".join(f"{e['node']} ({e['weights']} {e['shape']}{', SwiGLU of its input fused' * e['swiglu']})"
                        for e in fp8))


def _arch_number(arch: str) -> int:
    digits = re.sub(r"\D", "", arch)
    return int(digits) if digits else 0


def _dims(dims) -> str:
    return ", ".join(str(d.size) if d.size is not None else f"{d.name or '?'} {d.min}..{d.opt}..{d.max}" for d in dims)


# ---- check -----------------------------------------------------------------------
def _cmd_check(args: argparse.Namespace) -> int:
    from et_trt_backend import preflight

    partitions = _partitions(args.file, args.data)
    if not partitions:
        print(f"{args.file}: no TensorRT partitions")
        return 0
    builder = _check_builder(args) if args.build else None
    total = failures = 0
    for i, partition in enumerate(partitions):
        model = load_onnx(partition)
        violations = preflight.check(model) + preflight.check_io(
            model, partition.contents.inputs, partition.contents.outputs)
        total += len(violations)
        status = "ok" if not violations else f"{len(violations)} violation(s)"
        print(f"[{i}] part {partition.contents.part!r}: {status}")
        for violation in violations:
            print(f"  {violation}")
        if builder is not None:
            failures += _check_build(builder, partition.contents, args.plugin_library)
    summary = f"{args.file}: {len(partitions)} partition(s), {total} violation(s)"
    print(summary + (f", {failures} build failure(s)" if builder is not None else ""))
    if args.build and builder is None and args.require_builder:
        return 1
    return 1 if total or failures else 0


def _check_builder(args: argparse.Namespace):
    """The NVIDIA builder `check --build` uses (TensorRT, else TensorRT for RTX), or None (said why)."""
    from et_trt_backend.engines import providers

    if args.plugin_library is not None and not args.plugin_library.is_file():
        raise UsageError(f"--plugin-library {args.plugin_library}: no such file")
    try:
        return providers.any_builder()
    except providers.BuilderUnavailable as e:
        consequence = "an error (--require-builder)" if args.require_builder else \
            "build check skipped (--require-builder makes this an error)"
        print(f"{e}: {consequence}")
        return None


def _check_build(builder, contents, plugin_library: Path | None) -> int:
    """Parses and builds one partition for its targets; prints the outcome, the parser's and builder's own
    messages verbatim; returns the number of failed targets."""
    from et_trt_backend.engines import onnx_build

    targets, note = onnx_build.check_targets(builder, contents.options.kernel_archs)
    if note:
        print(f"    {builder}: {note}")
    failed = 0
    for target in targets:
        where = target or "this GPU"
        try:
            engine = onnx_build.parse_and_build(builder, contents, target, plugin_library)
        except onnx_build.BuildFailed as e:
            print(f"    {builder}: FAILED for {where}: " + str(e).replace("\n", "\n    "))
            if not e.parsed:  # the parse does not depend on the target
                return len(targets)
            failed += 1
            continue
        print(f"    {builder}: built for {where} in {engine.seconds:.1f} s ({_size(len(engine.plan))})")
    return failed


# ---- shared ----------------------------------------------------------------------
def _read_pte(path: Path) -> bytes:
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    return path.read_bytes()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="et-trt", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, other libraries' logs and warnings included")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    commands = parser.add_subparsers(dest="command", required=True)

    export_cmd = commands.add_parser("export", help="export a policy to a .pte with TensorRT partitions")
    export_cmd.add_argument("--module", help="factory returning a torch.export.ExportedProgram: pkg.mod:factory "
                            "or path/to/file.py:factory (default: the example MoE policy)")
    export_cmd.add_argument("--recipe", type=Path, help="recipe file, TOML or YAML (default: the example's "
                            "recipe for the example policy, else default options)")
    export_cmd.add_argument("--output", "-o", type=Path, help="the .pte to write (default: <module>.pte)")
    export_cmd.add_argument("--external-data", type=Path, metavar="DIR", help="write the TensorRT partitions' "
                            "weights and engines to DIR/<output name>.ptd, beside a small .pte (default: in the .pte)")
    export_cmd.set_defaults(run=_cmd_export)

    inspect_cmd = commands.add_parser("inspect", help="partitions, ops, options, kernel images, engine status")
    inspect_cmd.add_argument("file", type=Path)
    inspect_cmd.add_argument("--data", type=Path, action="append", metavar="FILE.ptd", help="the program's data "
                             "file (default: the ones its partitions name, beside the .pte)")
    inspect_cmd.add_argument("--dump-onnx", type=Path, metavar="DIR", help="write each partition's ONNX to DIR "
                             "(for trtexec or Polygraphy)")
    inspect_cmd.set_defaults(run=_cmd_inspect)

    check_cmd = commands.add_parser("check", help="TensorRT pre-flight check of each partition; exit 1 on violations")
    check_cmd.add_argument("file", type=Path)
    check_cmd.add_argument("--data", type=Path, action="append", metavar="FILE.ptd", help="the program's data "
                           "file (default: the ones its partitions name, beside the .pte)")
    check_cmd.add_argument("--build", action="store_true", help="then parse and build each partition with NVIDIA's "
                           "own ONNX parser and builder (TensorRT where installed, else TensorRT for RTX) for its "
                           "targets; exit 1 on any failure")
    check_cmd.add_argument("--require-builder", action="store_true", help="with --build: fail where no NVIDIA "
                           "builder is installed (default: skip the build check and say so)")
    check_cmd.add_argument("--plugin-library", type=Path, metavar="PATH", help="with --build: use this GroupedMM "
                           "plugin library (libet_trt_plugin.so, the C++ plugin) instead of the Python build phase")
    check_cmd.set_defaults(run=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_config.configure(verbose=args.verbose, quiet=args.quiet)
    from et_trt_backend.lowering.errors import LoweringError
    from et_trt_backend.options import OptionsError
    from et_trt_backend.preflight import PreflightError
    from et_trt_backend.serialization.blob import BlobError
    from et_trt_backend.serialization.pte import PteError
    from et_trt_partitioner import PartitionError

    # Errors that explain themselves (what is wrong, where, the fix): no traceback.
    try:
        return args.run(args)
    except (UsageError, OptionsError, PreflightError, BlobError, PteError, PartitionError, LoweringError) as e:
        print(f"et-trt {args.command}: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
