"""pyproject.toml lists packages by hand (the partitioner dir is mapped); none may be missing."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _package_dirs(top: str, import_name: str) -> set[str]:
    base = ROOT / top
    return {
        ".".join([import_name, *init.parent.relative_to(base).parts])
        for init in base.rglob("__init__.py")
    }


def test_every_python_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = _package_dirs("et_trt_backend", "et_trt_backend") | _package_dirs("partitioner", "et_trt_partitioner")
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "these are listed in pyproject.toml but have no __init__.py"
    assert config["package-dir"]["et_trt_partitioner"] == "partitioner"
