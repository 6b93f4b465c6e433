"""Parse a partition's ONNX with NVIDIA's ONNX parser and build its engine, in this process.

The same steps the C++ runtime takes at init (runtime/src/tensorrt/tensorrt_builder.cc,
build_plan): a strongly typed network (the precision is in the ONNX's types), the
plugins for the blob's kernel images, the partition's BuildOptions and one
optimization profile from the blob's IO specs. The plugins are our Python build-phase
GroupedMM plugin (grouped_mm_plugin.py), or the C++ plugin library (GroupedMM and
MoEExperts) where one is given or the partition has MoEExperts nodes, which have no
Python build phase.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import pathlib
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import onnx
import torch

from et_trt_backend.engines import grouped_mm_plugin
from et_trt_backend.engines.providers import RTX_TARGETS, Builder
from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN, MOE_EXPERTS_OP
from et_trt_backend.serialization import blob

logger = logging.getLogger(__name__)

# How the C++ plugins begin the messages they log (runtime/src/tensorrt/grouped_mm_plugin.cc and
# moe_experts_plugin.cc, log): a refusal while parsing is reported with the parser's errors, as the Python plugin's
# refusals are.
CPP_PLUGIN_PREFIXES = ("GroupedMM plugin: ", "MoEExperts plugin: ")


# The TensorRT type (trt.DataType member) of each IO spec dtype the runtime binds.
_TRT_TYPE_NAMES = {
    torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BF16", torch.int8: "INT8", torch.uint8: "UINT8",
    torch.int32: "INT32", torch.int64: "INT64", torch.bool: "BOOL",
}


class BuildFailed(RuntimeError):
    """The parser or the builder refused the partition; `errors` holds their messages verbatim,
    `parsed` whether the parser accepted it (a parse failure fails every target alike)."""

    def __init__(self, summary: str, errors: list[str], parsed: bool = True):
        super().__init__(summary + (":\n  " + "\n  ".join(errors) if errors else ""))
        self.errors, self.parsed = errors, parsed


@dataclasses.dataclass
class Engine:
    plan: bytes
    compute_capability: int  # the target; 0 for "the GPU here" (TensorRT)
    seconds: float
    options_not_applied: list[str]  # partition options this provider did not apply, and why


@functools.cache
def _logger(trt: ModuleType):
    """`trt`'s logger for every build of this process. TensorRT keeps the first logger a process hands it (a
    later one is ignored, with a warning, and a freed first one is called all the same), so there is one per
    module, alive for good; each build collects its errors through `collecting()`."""

    class Logger(trt.ILogger):
        """Collects the errors of the builds on this thread (reported verbatim by the caller) and forwards
        the rest to logging."""

        def __init__(self):
            trt.ILogger.__init__(self)
            self._collected = threading.local()

        @contextlib.contextmanager
        def collecting(self) -> Iterator[list[str]]:
            """The errors logged on this thread while inside."""
            outer = getattr(self._collected, "errors", None)
            self._collected.errors = errors = []
            try:
                yield errors
            finally:
                self._collected.errors = outer

        def log(self, severity, message):
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                errors = getattr(self._collected, "errors", None)
                if errors is not None:
                    errors.append(message)
                logger.debug("%s", message)
            elif severity == trt.ILogger.Severity.WARNING:
                logger.warning("%s", message)
            else:
                logger.debug("%s", message)

    return Logger()


def options_not_applied(options) -> list[str]:
    """The partition options a build here does not apply, each with why (logged, and recorded in the engine)."""
    notes = []
    if options.timing_cache:
        notes.append(f"timing_cache {options.timing_cache!r}: not read by a build at export (TensorRT for RTX reads "
                     "one only with a GPU present); the device's own build uses it")
    return notes


def check_targets(builder: Builder, kernel_archs) -> tuple[list[str | None], str]:
    """The targets to check a partition's build for, and a note where they are not the partition's own:
    TensorRT builds for the GPU here; TensorRT for RTX for its targets in kernel_archs, or for sm_80 where
    kernel_archs names none (the network is checked; the device builds its own engine)."""
    if not builder.ahead_of_time:
        return [None], ""
    targets = [arch for arch in kernel_archs if arch in RTX_TARGETS]
    if targets:
        return targets, ""
    return ["sm_80"], (f"kernel_archs ({', '.join(kernel_archs)}) names no target {builder.name} builds for; "
                       "checked with an sm_80 build")


def _parser_error(error) -> str:
    """One parser error as the parser states it, with the node it concerns."""
    where = f"node {error.node_name()!r} ({error.node_operator()})" if error.node_name() else "model"
    return f"{where}: {error.desc()}"


def plugin_library_for(contents: blob.BlobContents, plugin_library: pathlib.Path | None = None) -> pathlib.Path | None:
    """The C++ plugin library a build of `contents` loads: `plugin_library` where given, else the one built here
    (runtime.plugin_library_path) where the partition has MoEExperts nodes; None: the Python GroupedMM plugin
    serves. runtime.RuntimeLoadError, saying how to build it, where the library is needed and missing."""
    if plugin_library is not None:
        return plugin_library
    nodes = onnx.load_from_string(contents.onnx).graph.node
    if not any((n.domain, n.op_type) == (GROUPED_MM_DOMAIN, MOE_EXPERTS_OP) for n in nodes):
        return None
    from et_trt_backend import runtime

    try:
        return runtime.plugin_library_path()
    except runtime.RuntimeLoadError as e:
        raise runtime.RuntimeLoadError(f"the partition's {MOE_EXPERTS_OP} nodes need the C++ plugin library "
                                       f"(they have no Python build phase): {e}") from None


@contextlib.contextmanager
def _plugin(trt: ModuleType, contents: blob.BlobContents, plugin_library: pathlib.Path | None):
    """Our GroupedMM plugin, available to the parser: the Python one, or the C++ library at `plugin_library`
    handed the blob's kernel images. Yields a list the plugin's refusals are appended to."""
    if plugin_library is None:
        with grouped_mm_plugin.registered(trt, contents.kernels) as creator:
            yield creator.refusals
        return
    from et_trt_backend import runtime

    registry = trt.get_plugin_registry()
    handle = registry.load_library(str(plugin_library))
    if handle is None:
        raise BuildFailed(f"{plugin_library}: not a TensorRT plugin library (getCreators missing?)", [])
    try:
        try:
            runtime.use_kernel_images(ctypes.CDLL(str(plugin_library)), contents)
        except RuntimeError as e:
            raise BuildFailed(f"{plugin_library} refused the blob's kernel images", [str(e)]) from e
        yield []
    finally:
        registry.deregister_library(handle)


def _io_type_mismatches(trt: ModuleType, network, contents: blob.BlobContents) -> list[str]:
    """Where a network input or output has another type than its IO spec. The runtime binds each ExecuTorch
    tensor as its spec says and refuses an engine whose tensor differs (tensorrt_executor.cc): an int64
    input the parser kept as INT64 ("Make sure input X has Int64 binding") is bound as int64, and this
    check makes sure it was kept."""
    types = {torch_dtype: getattr(trt.DataType, name) for torch_dtype, name in _TRT_TYPE_NAMES.items()}
    tensors = [network.get_input(i) for i in range(network.num_inputs)] + \
        [network.get_output(i) for i in range(network.num_outputs)]
    by_name = {t.name: t.dtype for t in tensors}
    return [f"'{spec.name}': the network's is {by_name.get(spec.name)}, the IO spec's {spec.dtype}"
            for spec in [*contents.inputs, *contents.outputs] if by_name.get(spec.name) != types.get(spec.dtype)]


def parse_partition(parser, contents: blob.BlobContents) -> bool:
    """Parses the partition's ONNX, its external initializers handed over from the blob's named data
    (the runtime does the same, IParser::loadInitializer): no ONNX with the weights inline is made."""
    if not contents.weights:
        return parser.parse(contents.onnx)
    if not parser.load_model_proto(contents.onnx):
        return False
    for weight in contents.weights:
        data = np.frombuffer(weight.data.view(), np.uint8)  # no copy; `contents` keeps the bytes alive
        if not parser.load_initializer(weight.name, data.ctypes.data, data.nbytes):
            return False
    return parser.parse_model_proto()


def parse_and_build(builder: Builder, contents: blob.BlobContents, target: str | None,
                    plugin_library: pathlib.Path | None = None) -> Engine:
    """The engine of the partition `contents` for `target`: a kernel_archs name in RTX_TARGETS for TensorRT
    for RTX, None (the GPU here) for TensorRT. BuildFailed with the parser's or builder's own messages if they
    refuse it. The plugins are plugin_library_for's: the C++ library at `plugin_library`, the one built here for
    MoEExperts nodes, else the Python GroupedMM plugin."""
    wanted = "a target in " + ", ".join(RTX_TARGETS) if builder.ahead_of_time else "no target (the GPU here)"
    if not (target in RTX_TARGETS if builder.ahead_of_time else target is None):
        raise ValueError(f"{builder} builds for {wanted}, not {target!r}")
    trt = builder.module
    log = _logger(trt)
    from et_trt_backend import runtime

    try:
        plugin_library = plugin_library_for(contents, plugin_library)
    except runtime.RuntimeLoadError as e:
        raise BuildFailed(f"{builder.name} cannot parse the partition here", [str(e)], parsed=False) from None
    with log.collecting() as logged:
        # The builder before the plugin library: the library asks for the process's logger when it is loaded.
        nv_builder = trt.Builder(log)
        network = nv_builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, log)
        # The plugin stays registered until the build is done: the network's plugin layers use it.
        with _plugin(trt, contents, plugin_library) as refusals:
            if not parse_partition(parser, contents):
                errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)] + refusals + \
                    [m for m in logged if m.startswith(CPP_PLUGIN_PREFIXES)]
                raise BuildFailed(f"{builder.name}'s ONNX parser refused the partition", errors, parsed=False)
            mismatches = _io_type_mismatches(trt, network, contents)
            if mismatches:
                raise BuildFailed("the parsed network's IO types are not the blob's IO specs, by which the runtime "
                                  "binds ExecuTorch's tensors (it would refuse the engine)", mismatches)
            config = _config(trt, nv_builder, network, contents, target)
            start = time.perf_counter()
            plan = nv_builder.build_serialized_network(network, config)
            seconds = time.perf_counter() - start
    if plan is None:
        raise BuildFailed(f"{builder} could not build the engine for {target or 'this GPU'}", logged)
    capability = int(RTX_TARGETS[target].removeprefix("SM")) if target is not None else 0
    return Engine(bytes(plan), capability, seconds, options_not_applied(contents.options))


def _config(trt: ModuleType, nv_builder, network, contents: blob.BlobContents, target: str | None):
    """The builder config of the partition's BuildOptions, with one profile from its IO specs' ranges."""
    config = nv_builder.create_builder_config()
    options = contents.options
    if options.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    config.builder_optimization_level = options.optimization_level
    if options.tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = nv_builder.create_optimization_profile()
    specs = {spec.name: spec for spec in contents.inputs}
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        if name not in specs:
            raise BuildFailed(f"the ONNX input {name!r} is not among the blob's inputs", [])
        dims = specs[name].dims
        profile.set_shape(name, *([d.size if d.size is not None else getattr(d, which) for d in dims]
                                  for which in ("min", "opt", "max")))
    config.add_optimization_profile(profile)
    if target is not None:
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, RTX_TARGETS[target]), 0)
    return config
