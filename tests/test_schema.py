"""The blob schema has one definition: schema_generated.py is flatc's output for schema.fbs."""

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
        [FLATC, "--python", "--gen-onefile", "-o", str(tmp_path), str(SERIALIZATION / "schema.fbs")],
        check=True,
    )
    fresh = (tmp_path / "schema_generated.py").read_text()
    committed = (SERIALIZATION / "schema_generated.py").read_text()
    assert committed == fresh, (
        "et_trt_backend/serialization/schema_generated.py is stale; regenerate it with\n"
        "  flatc --python --gen-onefile -o et_trt_backend/serialization et_trt_backend/serialization/schema.fbs"
    )


def test_schema_fbs_ships_with_the_package():
    import importlib.resources

    fbs = importlib.resources.files("et_trt_backend") / "serialization" / "schema.fbs"
    assert "root_type Blob;" in fbs.read_text()
