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
import re
import sys
from pathlib import Path
from typing import Any, Callable

import et_trt_backend

from . import log_config
from .export import UsageError, export, file_safe, require_file

logger = logging.getLogger(__name__)

# The example policy and recipe: et_trt_backend/examples in an installed package (`pip install .`
# ships them there), else examples/ of the source checkout the package is imported from.
_PACKAGED_EXAMPLES = Path(et_trt_backend.__file__).resolve().parent / "examples"
EXAMPLES_DIR = (_PACKAGED_EXAMPLES if _PACKAGED_EXAMPLES.is_dir()
                else Path(et_trt_backend.__file__).resolve().parents[1] / "examples")
EXAMPLE_MODULE = f"{EXAMPLES_DIR / 'moe_policy.py'}:export_policy"
EXAMPLE_RECIPE = EXAMPLES_DIR / "recipe.toml"


# ---- export ------------------------------------------------------------------
def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by "pkg.mod:name" or "path/to/file.py:name" (whose folder goes on sys.path)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--module {spec!r}: write it as pkg.mod:factory or path/to/file.py:factory")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise UsageError(f"--module {spec!r}: no file {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # as `python file.py` would: the file's neighbours are importable
            sys.path.insert(0, folder)
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


def _cmd_export(args: argparse.Namespace) -> int:
    module = args.module or EXAMPLE_MODULE
    recipe = args.recipe
    if recipe is None and args.module is None and EXAMPLE_RECIPE.is_file():
        recipe = EXAMPLE_RECIPE
    if args.module is None and not EXAMPLES_DIR.is_dir():
        raise UsageError(f"the example policy ships with the source tree ({EXAMPLES_DIR}); pass --module")
    source = module.rpartition(":")[0]
    output = args.output or Path((Path(source).stem if source.endswith(".py") else source.rpartition(".")[2]) + ".pte")
    logger.info("importing torch")
    log_config.configure_torch(args.verbose)
    result = export(load_factory(module), recipe, output, name=module, data_dir=args.external_data)
    data = "".join(f", {path} {_size(path.stat().st_size)}" for path in result["data_files"])
    print(f"{output}: {_size(result['pte_bytes'])}{data}, exported in {result['total_s']:.1f} s")
    _print_summary(output, _read_pte(output, args.verbose), result["data_files"])
    return 0


# ---- inspect -------------------------------------------------------------------
def _cmd_inspect(args: argparse.Namespace) -> int:
    partitions = _print_summary(args.file, _read_pte(args.file, args.verbose), args.data, detail=True)
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
        path = folder / f"{i}_{file_safe(contents.part or 'partition')}.onnx"
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


def _partitions(path: Path, pte: bytes, data_files: list[Path] | None, missing_data_ok: bool = False) -> list:
    """The TensorRT partitions of the .pte at `path` (its bytes `pte`), their named data read from the .pte and
    `data_files` (--data), else from the data files they name beside the .pte."""
    from et_trt_backend.serialization.pte import read_partitions

    for data_file in data_files or []:
        require_file(data_file, "--data", ".ptd")
    return read_partitions(pte, data_files or (), data_dir=path.parent, missing_data_ok=missing_data_ok)


def _print_summary(path: Path, pte: bytes, data_files: list[Path] | None = None, detail: bool = False) -> list:
    from et_trt_backend import BACKEND_ID
    from et_trt_backend.serialization.pte import read_delegates, read_plans

    others = collections.Counter(d.backend_id for d in read_delegates(pte) if d.backend_id != BACKEND_ID)
    partitions = _partitions(path, pte, data_files, missing_data_ok=True)
    print(f"{len(partitions)} TensorRT partition(s)"
          + (f"; other delegates: {dict(others)}" if others else ""))
    for plan in read_plans(pte):  # per program: its delegates (the TensorRT ones by number, below), what is left
        held = ", ".join(f"[{i}]" for i, p in enumerate(partitions) if p.delegate.plan == plan.name)
        outside = ", ".join(f"{op} {n}" for op, n in plan.kernel_calls.most_common())
        print(f"plan {plan.name!r}: {plan.delegate_calls} delegate call(s); ops outside the delegates (ExecuTorch's "
              f"kernels): {outside or 'none'}" + (f"; TensorRT partitions {held}" if held else ""))
    for i, partition in enumerate(partitions):
        _print_partition(i, partition, detail)
    return partitions


def _print_partition(i: int, partition, detail: bool) -> None:
    from et_trt_backend.kernels.robot_gpus import robot_gpus_line
    from et_trt_backend.onnx_analysis import load_onnx, onnx_ops, onnx_precision
    from et_trt_backend.serialization.blob import PROVIDERS

    c, d = partition.contents, partition.delegate
    print(f"\n[{i}] part {c.part!r}: plan '{d.plan}' delegate {d.index}, blob {_size(len(d.data))}, "
          f"content id {partition.header.content_id[:16]}")
    for kind, specs in (("inputs", c.inputs), ("outputs", c.outputs)):
        print(f"    {kind}:")
        for spec in specs:
            print(f"      {spec.name}: {str(spec.dtype).removeprefix('torch.')} [{_dims(spec.dims)}]")
    if c.checks:  # counted_rows.py's, or the model's own torch._assert_async: the runtime fails a call on each
        print("    checks (a call fails with the message where its output is false):")
        for check in c.checks:
            print(f"      {check.output.name}: {check.message}")
    model = load_onnx(partition)
    ops, opset = onnx_ops(model)
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
    int4 = _int4_line(model)
    if int4:
        print("    " + int4)
    for line in _moe_block_lines(model):
        print("    " + line)
    options = c.options.to_json()
    if detail:
        print(f"    options: {json.dumps(options, sort_keys=True)}")
    else:
        print(f"    options: precision {options['precision']}, engine_build {options['engine_build']}")
    if not c.kernels:
        print("    kernel images: none (no GroupedMM or MoEExperts, or the grouped-GEMM kernel is off)")
    elif detail:
        print(f"    kernel images ({len(c.kernels)}):")
        for k in c.kernels:
            print(f"      {k.arch:8} {k.format:5} {k.kernel} {k.dtype} {_size(k.image.size)}, {k.num_warps} warps, "
                  f"{k.shared_bytes} B shared, tile {k.block_m}x{k.block_n}x{k.block_k}"
                  f"{', persistent' if k.persistent else ''}{', PTX ' + k.ptx_version if k.ptx_version else ''}")
    else:
        archs = {fmt: sorted({k.arch for k in c.kernels if k.format == fmt}, key=_arch_number)
                 for fmt in ("cubin", "ptx")}
        moe = sum(k.kernel.startswith("moe_") for k in c.kernels)
        print(f"    kernel images: {len(c.kernels)}{f' ({moe} for MoEExperts)' if moe else ''}, "
              f"{_size(sum(k.image.size for k in c.kernels))}; "
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


def _fp8_line(model) -> str:
    """Which MoEExperts and GroupedMMs of the partition have FP8 weights, and their bytes."""
    from et_trt_backend.onnx_analysis import fp8_grouped_mms, fp8_moe_experts, is_grouped_mm, node_group_size

    total = sum(is_grouped_mm(node) and not node_group_size(node) for node in model.graph.node)  # INT4: _int4_line
    fused, grouped = fp8_moe_experts(model), fp8_grouped_mms(model)
    if not fused and not grouped:
        return f"FP8 experts: none ({total} GroupedMM in the part's precision)"
    counts = [f"{len(fused)} MoEExperts"] * bool(fused) + [f"{len(grouped)} of {total} GroupedMM"] * bool(grouped)
    nodes = [e["node"] for e in fused] + [
        f"{e['node']} ({e['weights']} {e['shape']}{', SwiGLU of its input fused' * e['swiglu']})" for e in grouped]
    return (f"FP8 experts: {' and '.join(counts)}, weights {_size(sum(e['weights_bytes'] for e in fused + grouped))} "
            f"e4m3 + {_size(sum(e['scales_bytes'] for e in fused + grouped))} scales: " + ", ".join(nodes))


def _int4_line(model) -> str:
    """The partition's nodes with INT4 expert weights, their group size and bytes; "" where none."""
    from et_trt_backend.onnx_analysis import int4_expert_nodes

    nodes = int4_expert_nodes(model)
    if not nodes:
        return ""
    counts = ", ".join(f"{sum(n['op'] == op for n in nodes)} {op}" for op in dict.fromkeys(n["op"] for n in nodes))
    groups = ", ".join(str(g) for g in sorted({n["group_size"] for n in nodes}))
    return (f"INT4 experts: {counts}, group {groups}, weights {_size(sum(n['weights_bytes'] for n in nodes))} packed "
            f"+ {_size(sum(n['scales_bytes'] for n in nodes))} bf16 scales: " + ", ".join(n["node"] for n in nodes))


def _moe_block_lines(model) -> list[str]:
    """Each MoE block's form, as the lowering recorded it: fused (one MoEExperts node) or GroupedMM, and why."""
    from et_trt_backend.onnx_analysis import moe_blocks

    blocks = moe_blocks(model)
    if not blocks:
        return []
    lines = [f"MoE blocks: {sum(b['form'] == 'MoEExperts' for b in blocks)} of {len(blocks)} fused"]
    for b in blocks:
        how = f"one MoEExperts node ({b['dtype']}, {b['detail']})" if b["form"] == "MoEExperts" else \
            f"GroupedMM: {b['detail']}"
        lines.append(f"  {b['block'] or '(the partition itself)'}: {how}")
    return lines


def _arch_number(arch: str) -> int:
    digits = re.sub(r"\D", "", arch)
    return int(digits) if digits else 0


def _dims(dims) -> str:
    return ", ".join(str(d.size) if d.size is not None else f"{d.name or '?'} {d.min}..{d.opt}..{d.max}" for d in dims)


# ---- check -----------------------------------------------------------------------
def _cmd_check(args: argparse.Namespace) -> int:
    partitions = _partitions(args.file, _read_pte(args.file, args.verbose), args.data)
    # Imported once the file is known to be a program: a wrong file is refused without them.
    from et_trt_backend import preflight
    from et_trt_backend.onnx_analysis import load_onnx

    if not partitions:
        print(f"{args.file}: no TensorRT partitions")
        return 0
    builder = _check_builder(args) if args.build else None
    total = failures = 0
    for i, partition in enumerate(partitions):
        model = load_onnx(partition)
        violations = preflight.check(model) + preflight.check_io(
            model, partition.contents.inputs, partition.contents.outputs, partition.contents.checks)
        total += len(violations)
        status = "ok" if not violations else f"{len(violations)} violation(s)"
        print(f"[{i}] part {partition.contents.part!r}: {status}")
        for violation in violations:
            print(f"  {violation}")
        if builder is not None:
            failures += _check_build(builder, partition.contents)
    summary = f"{args.file}: {len(partitions)} partition(s), {total} violation(s)"
    print(summary + (f", {failures} build failure(s)" if builder is not None else ""))
    if args.build and builder is None and args.require_builder:
        return 1
    return 1 if total or failures else 0


def _check_builder(args: argparse.Namespace):
    """The NVIDIA builder `check --build` uses (TensorRT, else TensorRT for RTX), or None (said why)."""
    from et_trt_backend.engines import providers

    if args.plugin_library is not None:
        require_file(args.plugin_library, "--plugin-library", ".so")
    try:
        return providers.any_builder(args.plugin_library)
    except providers.BuilderUnavailable as e:
        consequence = "an error (--require-builder)" if args.require_builder else \
            "build check skipped (--require-builder makes this an error)"
        print(f"{e}: {consequence}")
        return None


def _check_build(builder, contents) -> int:
    """Parses and builds one partition for its targets; prints the outcome, the parser's and builder's own
    messages verbatim; returns the number of failed targets."""
    from et_trt_backend.engines import onnx_build, providers

    targets, note = onnx_build.check_targets(builder, contents.options.kernel_archs)
    if note:
        print(f"    {builder}: {note}")
    failed = 0
    for target in targets:
        where = target or "this GPU"
        try:
            engine = onnx_build.parse_and_build(builder, contents, target)
        except (onnx_build.BuildFailed, providers.BuilderUnavailable) as e:
            print(f"    {builder}: FAILED for {where}: " + str(e).replace("\n", "\n    "))
            if not e.parsed:  # the parse does not depend on the target
                return len(targets)
            failed += 1
            continue
        print(f"    {builder}: built for {where} in {engine.seconds:.1f} s ({_size(len(engine.plan))})")
    return failed


# ---- shared ----------------------------------------------------------------------
def _read_pte(path: Path, verbose: bool) -> bytes:
    """The bytes of the .pte at `path`, refused (PteError) unless they are an ExecuTorch program, which is known
    before ExecuTorch is imported to read them."""
    from et_trt_backend.serialization.pte_header import check_identifier

    require_file(path, "", ".pte")
    pte = path.read_bytes()
    check_identifier(pte)
    logger.info("loading ExecuTorch's program reader (torch and ExecuTorch)")
    log_config.configure_torch(verbose)  # the reader imports torch
    return pte


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _add_program_arguments(command: argparse.ArgumentParser) -> None:
    """The .pte a command reads, and its data files."""
    command.add_argument("file", type=Path)
    command.add_argument("--data", type=Path, action="append", metavar="FILE.ptd", help="the program's data file "
                         "(default: the ones its partitions name, beside the .pte)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="et-trt", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, other libraries' logs and warnings included")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    commands = parser.add_subparsers(dest="command", required=True)

    export_cmd = commands.add_parser("export", help="export a policy to a .pte with TensorRT partitions")
    export_cmd.add_argument("--module", help="factory returning a torch.export.ExportedProgram, or a dict of method "
                            "name -> ExportedProgram for a .pte of several methods: pkg.mod:factory or "
                            "path/to/file.py:factory (default: the example MoE policy)")
    export_cmd.add_argument("--recipe", type=Path, help="recipe file, TOML or YAML (default: the example's "
                            "recipe for the example policy, else default options)")
    export_cmd.add_argument("--output", "-o", type=Path, help="the .pte to write (default: <module>.pte)")
    export_cmd.add_argument("--external-data", type=Path, metavar="DIR", help="write the TensorRT partitions' "
                            "weights and engines to DIR/<output name>.ptd, beside a small .pte (default: in the .pte)")
    export_cmd.set_defaults(run=_cmd_export)

    inspect_cmd = commands.add_parser("inspect", help="partitions, ops (and those outside them), options, kernel "
                                      "images, engine status")
    _add_program_arguments(inspect_cmd)
    inspect_cmd.add_argument("--dump-onnx", type=Path, metavar="DIR", help="write each partition's ONNX to DIR "
                             "(for trtexec or Polygraphy)")
    inspect_cmd.set_defaults(run=_cmd_inspect)

    check_cmd = commands.add_parser("check", help="TensorRT pre-flight check of each partition; exit 1 on violations")
    _add_program_arguments(check_cmd)
    check_cmd.add_argument("--build", action="store_true", help="then parse and build each partition with NVIDIA's "
                           "own ONNX parser and builder (TensorRT where installed, else TensorRT for RTX) for its "
                           "targets; exit 1 on any failure")
    check_cmd.add_argument("--require-builder", action="store_true", help="with --build: fail where no NVIDIA "
                           "builder is installed (default: skip the build check and say so)")
    check_cmd.add_argument("--plugin-library", type=Path, metavar="PATH", help="with --build: build with this "
                           "libet_trt_plugin.so (et-trt's engine builder and GroupedMM plugin) instead of the one "
                           "found by default")
    check_cmd.set_defaults(run=_cmd_check)
    return parser


# Errors that explain themselves (what is wrong, where, the fix), printed without a traceback: (module, class).
# Looked up only in modules already imported (an error of a module never imported cannot have been raised),
# so that naming them imports nothing: `inspect` and `check` start without torch.
EXPLAINED_ERRORS = (
    ("et_trt_backend.lowering.errors", "LoweringError"),
    ("et_trt_backend.options", "OptionsError"),
    ("et_trt_backend.preflight", "PreflightError"),
    ("et_trt_backend.serialization.blob", "BlobError"),
    ("et_trt_backend.serialization.pte_header", "PteError"),
    ("et_trt_partitioner.errors", "PartitionError"),
)


def _explained(error: Exception) -> bool:
    return any(isinstance(error, getattr(sys.modules[module], name))
               for module, name in EXPLAINED_ERRORS if module in sys.modules)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_config.configure(verbose=args.verbose, quiet=args.quiet)
    try:
        return args.run(args)
    except UsageError as e:
        print(f"et-trt {args.command}: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if not _explained(e):
            raise
        print(f"et-trt {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
