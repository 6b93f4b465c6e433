"""Running et-trt `.pte` files from Python: load the C++ delegate into ExecuTorch's runtime.

    from et_trt_backend import runtime
    program = runtime.load_program("policy.pte", data_path="policy.ptd")  # the delegate loaded, the .ptd checked
    method = program.load_method("forward")

runtime.load() alone registers "EtTrtBackend" for ExecuTorch's own `Runtime.get().load_program`, which
reads a .ptd without checking it (verify_data_file does).

The delegate is `libet_trt_runtime.so`, built from runtime/: into the package by `pip install .`,
or into runtime/build of a source checkout by scripts/build_runtime.sh (libraries.py). It links
the ExecuTorch wheel's libexecutorch.so, the library the Python runtime uses too, and registers
itself there when loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import pathlib

import numpy as np

from et_trt_backend import BACKEND_ID, libraries
from et_trt_backend.serialization import blob

logger = logging.getLogger(__name__)

LIBRARY_ENV = "ET_TRT_RUNTIME_LIBRARY"
ENGINE_CACHE_ENV = "ET_TRT_ENGINE_CACHE"
LIBRARY_NAME = "libet_trt_runtime.so"
PLUGIN_LIBRARY_ENV = "ET_TRT_PLUGIN_LIBRARY"
RTX_DIR_ENV = "ET_TRT_TENSORRT_RTX_DIR"
PLUGIN_LIBRARY_NAME = "libet_trt_plugin.so"
_BUILD_DIR = "runtime/build"
# Where a source checkout builds the plugin library: runtime/build when TensorRT's headers were given
# to build_runtime.sh, runtime/build-tensorrt-<version> by scripts/build_tensorrt_layers.sh.
_PLUGIN_BUILD_DIRS = (_BUILD_DIR, "runtime/build-tensorrt-11.1")

_loaded: ctypes.CDLL | None = None


class RuntimeLoadError(RuntimeError):
    """The delegate library cannot be found or loaded; the message says how to fix it."""


class DataFileError(ValueError):
    """A data file (.ptd) ExecuTorch cannot read safely; the message (one line) names it and what is wrong."""


def library_path() -> pathlib.Path:
    """$ET_TRT_RUNTIME_LIBRARY if set, else the installed package's, else runtime/build/ of this source
    checkout (where it is built, or would be)."""
    if os.environ.get(LIBRARY_ENV):
        return pathlib.Path(os.environ[LIBRARY_ENV])
    return libraries.find(LIBRARY_NAME, [_BUILD_DIR]) or libraries.SOURCE_ROOT / _BUILD_DIR / LIBRARY_NAME


def plugin_library_path() -> pathlib.Path:
    """libet_trt_plugin.so: et-trt's engine builder (et_trt_backend.engines loads it) and our C++
    GroupedMM plugin as a TensorRT plugin library, for any TensorRT or TensorRT for RTX process
    (`registry.load_library(path)`; hand it each blob's kernel images with use_kernel_images
    before parsing the blob's ONNX).

    $ET_TRT_PLUGIN_LIBRARY if set, else the installed package's, else the first one built under
    runtime/ of this source checkout. Raises RuntimeLoadError, saying how to build it, if there is none.
    """
    if os.environ.get(PLUGIN_LIBRARY_ENV):
        return pathlib.Path(os.environ[PLUGIN_LIBRARY_ENV])
    path = libraries.find(PLUGIN_LIBRARY_NAME, _PLUGIN_BUILD_DIRS)
    if path is not None:
        return path
    raise RuntimeLoadError(
        f"{PLUGIN_LIBRARY_NAME} is not built: it needs TensorRT's headers, e.g. "
        "scripts/build_tensorrt_layers.sh (with ../shared/third_party/tensorrt) or scripts/build_runtime.sh "
        "-DET_TRT_TENSORRT_INCLUDE_DIR=<TensorRT include dir> in a source checkout, or "
        "`pip install . -C cmake.define.ET_TRT_TENSORRT_INCLUDE_DIR=<TensorRT include dir>`; "
        f"or point {PLUGIN_LIBRARY_ENV} at one"
    )


def use_kernel_images(plugin_library: ctypes.CDLL, contents: blob.BlobContents) -> bytes:
    """Hands the kernel images of the blob `contents` (its named data attached) to the loaded plugin
    library: GroupedMM nodes parsed next on this thread take them, and engines referencing them
    deserialize. Returns their kernel_images_id (sha256 of the images, schema.fbs). Raises
    RuntimeError if the blob or its named data is refused."""
    fn = plugin_library.et_trt_plugin_use_kernel_images
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, *NAMED_DATA_ARGTYPES, ctypes.c_char_p, ctypes.c_char_p,
                   ctypes.c_size_t]
    data = blob.serialize(contents)
    ident, error = ctypes.create_string_buffer(32), ctypes.create_string_buffer(4096)
    if fn(data, len(data), *named_data_arrays(contents), ident, error, len(error)) != 0:
        raise RuntimeError(error.value.decode(errors="replace"))
    return ident.raw


# A blob's named data passed to the C entry points: keys, bytes, sizes, count.
NAMED_DATA_ARGTYPES = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]


def named_data_arrays(contents: blob.BlobContents) -> tuple:
    """The blob's named data (attached) as the C entry points take it; the bytes are not copied and
    `contents` keeps them alive."""
    named = contents.named_data()
    views = [np.frombuffer(data.view(), np.uint8) for data in named]
    keys = (ctypes.c_char_p * len(named))(*(data.key.encode() for data in named))
    values = (ctypes.c_void_p * len(named))(*(view.ctypes.data for view in views))
    sizes = (ctypes.c_size_t * len(named))(*(view.nbytes for view in views))
    return keys, values, sizes, len(named)


def load(path: str | os.PathLike | None = None, engine_cache_dir: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Loads the delegate so that executorch.runtime runs `.pte` files with TensorRT partitions.

    `engine_cache_dir` sets where engines built on this machine are cached
    ($ET_TRT_ENGINE_CACHE, read by the delegate at each init). Loading twice
    is a no-op that returns the first library.
    """
    global _loaded
    if engine_cache_dir is not None:
        os.environ[ENGINE_CACHE_ENV] = str(engine_cache_dir)
    if path is None and _loaded is not None:
        return _loaded  # loaded from a path given earlier: the default path may hold none
    point_at_tensorrt_rtx()
    lib_path = pathlib.Path(path) if path is not None else library_path()
    if not lib_path.is_file():
        raise RuntimeLoadError(
            f"{lib_path} does not exist: build the C++ runtime with scripts/build_runtime.sh in a source "
            f"checkout, or install et-trt with `pip install .` (which builds it into {libraries.PACKAGE_LIB_DIR}), "
            f"or point {LIBRARY_ENV} at a built {LIBRARY_NAME}"
        )
    if _loaded is not None:
        return _loaded
    # The Python runtime first, so the delegate registers into the libexecutorch.so it uses.
    from executorch.runtime import Runtime

    try:
        lib = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise RuntimeLoadError(f"cannot load {lib_path}: {e}") from e
    names = Runtime.get().backend_registry.registered_backend_names
    if BACKEND_ID not in names:
        raise RuntimeLoadError(
            f"{lib_path} loaded but '{BACKEND_ID}' is not registered (registered: {names}); the library "
            "was probably built against another libexecutorch.so than the one executorch.runtime uses"
        )
    logger.info("loaded %s: '%s' registered", lib_path, BACKEND_ID)
    _loaded = lib
    return lib


def verify_data_file(path: str | os.PathLike) -> None:
    """Raises DataFileError (one line naming the file and what is wrong) unless `path` is an ExecuTorch data
    file (.ptd) whose structure ExecuTorch can read without going out of bounds: the C++
    et_trt::verify_data_file (runtime/include/et_trt/data_file.h), which et_trt_runner runs too. ExecuTorch
    runs no flatbuffers Verifier on a .ptd itself, and a damaged one can crash the process that loads it."""
    fn = load().et_trt_verify_data_file
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(4096)
    if fn(os.fsencode(path), error, len(error)) != 0:
        raise DataFileError(error.value.decode(errors="replace"))


def load_program(program: str | os.PathLike | bytes, data_path: str | os.PathLike | None = None, **kwargs):
    """ExecuTorch's `Runtime.get().load_program(program, data_path=...)` (keyword arguments pass through) with the
    delegate loaded and the data file verified first (verify_data_file)."""
    from executorch.runtime import Runtime

    load()
    if data_path is not None:
        verify_data_file(data_path)
    return Runtime.get().load_program(program, data_path=data_path, **kwargs)


def point_at_tensorrt_rtx() -> None:
    """Sets $ET_TRT_TENSORRT_RTX_DIR (where the delegate opens TensorRT for RTX) to the installed
    tensorrt-rtx wheel's library folder, unless it is set already or the wheel is absent."""
    if os.environ.get(RTX_DIR_ENV):
        return
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is not None and spec.origin is not None:
        os.environ[RTX_DIR_ENV] = str(pathlib.Path(spec.origin).parent)
        logger.info("TensorRT for RTX: %s=%s", RTX_DIR_ENV, os.environ[RTX_DIR_ENV])
