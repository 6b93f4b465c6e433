"""The Python modules import each other one way: no import circle, imports inside functions included."""

import ast
import graphlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"et_trt_backend": ROOT / "et_trt_backend", "et_trt_partitioner": ROOT / "partitioner"}


def modules_of(packages: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__.py)."""
    modules = {}
    for top, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules among `modules` that `name` imports anywhere in its file. `from pkg import sub`
    imports the module pkg.sub, not pkg's __init__ (which Python runs first anyway, as a parent)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def import_circle(packages: dict[str, pathlib.Path]) -> list[str] | None:
    """One import circle among the packages' modules (its modules in order), or None."""
    modules = modules_of(packages)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_no_import_circle():
    circle = import_circle(PACKAGES)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    assert sorted(set(import_circle({"pkg": package}))) == ["pkg.a", "pkg.b"]


@pytest.mark.parametrize("module, imported", [
    ("et_trt_backend.kernels.aot", "et_trt_backend.kernels.sm90"),
    ("et_trt_backend.kernels.sm90", "et_trt_backend.kernels.images"),
])
def test_the_kernel_modules_depend_one_way(module, imported):
    modules = modules_of(PACKAGES)
    assert imported in imports_of(module, modules[module], modules)


def test_the_backend_never_imports_the_partitioner():
    """et_trt_partitioner -> et_trt_backend, never back (the CLI and export() live in the partitioner)."""
    modules = modules_of(PACKAGES)
    backward = {name: sorted(m for m in imports_of(name, path, modules) if m.partition(".")[0] == "et_trt_partitioner")
                for name, path in modules.items() if name.partition(".")[0] == "et_trt_backend"}
    assert not {name: found for name, found in backward.items() if found}


def test_test_modules_share_helpers_through_support_only():
    """What several test modules need lives in tests/support/; no test module (nor a helper) imports a test module."""
    tests = ROOT / "tests"
    test_modules = {path.stem: path for path in tests.glob("test_*.py")}
    importers = {**test_modules, **{f"support.{path.stem}": path for path in (tests / "support").glob("*.py")}}
    found = {name: sorted(imports_of(name, path, test_modules)) for name, path in importers.items()}
    assert {name: imported for name, imported in found.items() if imported} == {}


def test_benchmark_results_hold_results_not_code():
    """benchmarks/results/ holds figures, logs and method; an experiment's code that was not kept lives in git history."""
    code = {".py", ".sh", ".patch", ".cu", ".cuh", ".cc", ".cpp", ".h"}
    found = [str(path.relative_to(ROOT)) for path in (ROOT / "benchmarks" / "results").rglob("*") if path.suffix in code]
    assert found == [], "move these out of benchmarks/results/ (git history keeps them)"


def test_every_benchmark_and_device_script_parses():
    """The benchmarks run only on the device; a syntax error there would cost a device call to find
    (moe_fp8_block_bench.py's missing '+' did)."""
    for path in sorted((ROOT / "benchmarks").rglob("*.py")) + sorted((ROOT / "tests").glob("*_check.py")):
        ast.parse(path.read_text(), str(path))  # raises SyntaxError naming the file and line
