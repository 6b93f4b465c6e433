"""Where et-trt's C++ libraries are: inside the installed package, else in a source checkout's build.

`pip install .` builds them into et_trt_backend/lib (runtime/CMakeLists.txt installs them there).
A source checkout with an editable install (scripts/setup.sh) has them in the CMake build folders
that scripts/build_runtime.sh makes under runtime/.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

PACKAGE_LIB_DIR = pathlib.Path(__file__).resolve().parent / "lib"
# The root of the source checkout this package is imported from (an installed package has none).
SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent


def find(name: str, build_dirs: Sequence[str]) -> pathlib.Path | None:
    """The library file `name` in PACKAGE_LIB_DIR, else in the first of `build_dirs` (folders of the
    source checkout, relative to its root) that holds it; None where none does."""
    for folder in (PACKAGE_LIB_DIR, *(SOURCE_ROOT / d for d in build_dirs)):
        if (folder / name).is_file():
            return folder / name
    return None
