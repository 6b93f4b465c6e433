"""The package's PEP 517 build backend: wheels from scikit-build-core, editable installs from setuptools.

`pip install .` builds a wheel with scikit-build-core, which builds runtime/ with CMake and
installs libet_trt_runtime.so and the launcher library into the package ([tool.scikit-build]
in pyproject.toml). `pip install -e .` (scripts/setup.sh) goes to setuptools ([tool.setuptools]):
its editable install builds no C++ (scripts/build_runtime.sh builds runtime/build, where a
source checkout finds the libraries), and Python looks it up after PYTHONPATH, so a copy of
the sources named there is the one imported (tests/test_reproducible.py exports from such
copies); scikit-build-core's editable finder would come before PYTHONPATH.
"""

from scikit_build_core.build import (
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)
from setuptools.build_meta import build_editable, get_requires_for_build_editable, prepare_metadata_for_build_editable

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]
