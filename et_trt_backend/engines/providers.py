"""The NVIDIA builders installed here: TensorRT (`tensorrt`) and TensorRT for RTX.

TensorRT builds for the GPU it runs on; TensorRT for RTX builds ahead of time,
with no GPU, for the compute capabilities in RTX_TARGETS. Both ship the same
Python API (builder, ONNX parser, plugin registry), so one code path drives
either. Nothing is imported until asked for: neither is a dependency of et-trt
(TensorRT for RTX is the `tensorrt-rtx` extra).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import pathlib
from types import ModuleType

from et_trt_backend.serialization.blob import PROVIDERS

# The Python module of TensorRT for RTX: `tensorrt_rtx_bindings` in the 1.7 wheels
# (tensorrt-rtx-cu13-bindings), `tensorrt_rtx` in other packagings.
RTX_MODULES = ("tensorrt_rtx", "tensorrt_rtx_bindings")
RTX_EXTRA = "pip install 'et-trt[tensorrt-rtx]'"
# kernel_archs entries TensorRT for RTX builds for, and its name of each target.
# It cannot target sm_87 (Orin), sm_90a (H100/H200), sm_100a or sm_110a (Thor).
RTX_TARGETS = {"sm_80": "SM80", "sm_86": "SM86", "sm_89": "SM89", "sm_120a": "SM120"}
# The library TensorRT for RTX's ONNX parser dlopens by its unversioned name when
# it adds a plugin layer; the wheels ship only the .so.1, and the process aborts.
RTX_LIBRARY = "libtensorrt_rtx.so"
RTX_PARSER_LIBRARY = "libtensorrt_onnxparser_rtx.so.1"


class BuilderUnavailable(RuntimeError):
    """No usable NVIDIA builder here; the message says what is missing and how to install it."""


@dataclasses.dataclass(frozen=True)
class Builder:
    """An installed NVIDIA builder: its Python module and what it is."""

    provider: str  # a key of blob.PROVIDERS
    module: ModuleType
    version: str

    @property
    def name(self) -> str:
        return PROVIDERS[self.provider]

    @property
    def ahead_of_time(self) -> bool:
        """Builds for named compute capabilities with no GPU (TensorRT for RTX)."""
        return self.provider == "tensorrt_rtx"

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def tensorrt_rtx() -> Builder:
    """TensorRT for RTX, ready to parse ONNX with plugins; BuilderUnavailable if absent or unusable."""
    module = None
    for name in RTX_MODULES:
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as e:
            if e.name != name:  # the module is there but something it needs is not
                raise BuilderUnavailable(f"TensorRT for RTX ({name}) does not import: {e}") from None
        except ImportError as e:  # e.g. its libraries do not load
            raise BuilderUnavailable(f"TensorRT for RTX ({name}) does not import: {e}") from None
    if module is None:
        raise BuilderUnavailable(f"TensorRT for RTX is not installed (no Python module {' or '.join(RTX_MODULES)}); "
                                 f"install it with {RTX_EXTRA}")
    missing = _missing_unversioned_library()
    if missing:
        raise BuilderUnavailable(missing)
    return Builder("tensorrt_rtx", module, module.__version__)


def tensorrt() -> Builder:
    """TensorRT (libnvinfer); BuilderUnavailable if its Python module is absent."""
    try:
        module = importlib.import_module("tensorrt")
    except ImportError as e:
        raise BuilderUnavailable(f"TensorRT is not installed (import tensorrt: {e})") from None
    if not hasattr(module, "Builder"):  # e.g. tensorrt-stubs, or a wheel whose libraries failed to load
        raise BuilderUnavailable(f"the Python module tensorrt at {module.__file__} has no Builder: not a TensorRT install")
    return Builder("tensorrt", module, module.__version__)


def any_builder() -> Builder:
    """TensorRT where installed, else TensorRT for RTX; BuilderUnavailable naming why neither is usable."""
    reasons = []
    for find in (tensorrt, tensorrt_rtx):
        try:
            return find()
        except BuilderUnavailable as e:
            reasons.append(str(e))
    raise BuilderUnavailable("no NVIDIA builder installed: " + "; ".join(reasons))


def _missing_unversioned_library() -> str:
    """Why TensorRT for RTX's parser would abort the process on a plugin node, or "" if it will not.

    Its parser finds the library through its own folder ($ORIGIN) or the loader's search path."""
    parser = _loaded_library(RTX_PARSER_LIBRARY)
    if parser is not None and (parser.parent / RTX_LIBRARY).exists():
        return ""
    try:
        ctypes.CDLL(RTX_LIBRARY)
        return ""
    except OSError:
        pass
    where = parser.parent if parser is not None else "the folder of libtensorrt_rtx.so.1"
    return (f"TensorRT for RTX lacks {RTX_LIBRARY} beside {RTX_PARSER_LIBRARY} (a bug of its wheels: its ONNX parser "
            f"opens that name when it adds a plugin layer, and the process aborts); create it with "
            f"`ln -s libtensorrt_rtx.so.1 {where}/{RTX_LIBRARY}` (scripts/setup.sh does)")


def _loaded_library(name: str) -> pathlib.Path | None:
    """The path this process loaded the shared library `name` from, if loaded."""
    try:
        maps = pathlib.Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.endswith("/" + name):
            return pathlib.Path(path)
    return None
