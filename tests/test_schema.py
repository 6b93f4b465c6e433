"""The blob schema has one definition: schema_generated.py is flatc's output for schema.fbs."""

import re
import subprocess
from pathlib import Path

import pytest

SERIALIZATION = Path(__file__).resolve().parents[1] / "et_trt_backend" / "serialization"
# The system flatc (Debian, 2.0.8) matches the C++ flatbuffers headers the runtime
# builds with. Named by path: the venv's `flatc` (ExecuTorch's wheel, 24.3.25)
# shadows it on PATH and writes differently formatted code.
FLATC = "/usr/bin/flatc"


@pytest.mark.skipif(not Path(FLATC).exists(), reason="flatc (Debian flatbuffers-compiler) is not installed")
def test_generated_python_is_flatc_output_of_schema(tmp_path):
    subprocess.run(
        [FLATC, "--python", "--gen-onefile", "--gen-object-api", "-o", str(tmp_path), str(SERIALIZATION / "schema.fbs")],
        check=True,
    )
    fresh = (tmp_path / "schema_generated.py").read_text()
    committed = (SERIALIZATION / "schema_generated.py").read_text()
    assert committed == fresh, (
        "et_trt_backend/serialization/schema_generated.py is stale; regenerate it with\n"
        "  /usr/bin/flatc --python --gen-onefile --gen-object-api -o /tmp/et_trt_schema \\\n"
        "    et_trt_backend/serialization/schema.fbs &&\n"
        "  cp /tmp/et_trt_schema/schema_generated.py et_trt_backend/serialization/"
    )


def test_schema_fbs_ships_with_the_package():
    import importlib.resources

    fbs = importlib.resources.files("et_trt_backend") / "serialization" / "schema.fbs"
    assert "root_type Blob;" in fbs.read_text()


ROOT = SERIALIZATION.parents[1]
# Where a record of the kernel image's fields could be written out again: code, not generated, not built.
_SOURCES = ("et_trt_backend", "partitioner", "runtime/src", "runtime/kernels", "runtime/tools", "runtime/runner",
            "benchmarks", "examples", "scripts")


def _schema_fields(table: str) -> list[str]:
    text = (SERIALIZATION / "schema.fbs").read_text()
    body = re.search(r"^table " + table + r" \{(.*?)^\}", text, re.S | re.M).group(1)
    return re.findall(r"^\s*(\w+)\s*:", body, re.M)


def _declarations(text: str, field: str) -> bool:
    """Whether `text` declares `field`: a Python class attribute, a C/C++ member or a ctypes field."""
    patterns = (rf"^\s+{field}\s*:\s*[\w\[\"']", rf"^\s*(?:const\s+)?[\w:<>*]+\s+{field}\s*(?:=|;|\{{)",
                rf"\(\s*[\"']{field}[\"']\s*,\s*ctypes\.")
    return any(re.search(p, text, re.M) for p in patterns)


def test_kernel_image_fields_are_declared_once_in_the_schema():
    """Every other side reads the flatc-generated code (issue 16): no file declares the kernel image's
    fields again. The fields whose names are the record's own (with an underscore: not `kernel` or
    `dtype`, which other records have too) are looked for; a file declaring most of them is a copy."""
    fields = [f for f in _schema_fields("KernelImage") if "_" in f]
    assert len(fields) >= 8, fields
    copies = {}
    for folder in _SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".h", ".cc", ".cu"} or "schema_generated" in path.name:
                continue
            text = path.read_text()
            declared = [f for f in fields if _declarations(text, f)]
            if len(declared) > len(fields) // 2:
                copies[str(path.relative_to(ROOT))] = declared
    assert not copies, f"the kernel image's fields are declared again outside schema.fbs: {copies}"


def test_the_declaration_check_finds_a_copy():
    copy = "struct Copy {\n  int num_warps = 4;\n  std::string ptx_version;\n};\n"
    python_copy = "class Copy:\n    num_warps: int\n    ptx_version: str\n"
    ctypes_copy = '_fields_ = [("num_warps", ctypes.c_int32), ("ptx_version", ctypes.c_char_p)]'
    for text in (copy, python_copy, ctypes_copy):
        assert _declarations(text, "num_warps") and _declarations(text, "ptx_version"), text
    assert not _declarations("v.num_warps = k->num_warps();\nKernelImage(num_warps=4)\n", "num_warps")
