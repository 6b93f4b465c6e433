"""The GroupedMM plugin's build phase in Python, for building engines at export with no C++ build.

It is the C++ plugin (runtime/src/tensorrt/grouped_mm_plugin.cc) as the builder
sees it: registered under the names of et_trt_backend/plugin_names.py; output
[rows, N] in a's dtype, bf16 or fp16 where the blob has kernel images of that
dtype, layout and weight format. Two forms, told apart by the input count:
  dense (3 inputs): a [rows, K], b [G, K, N] (or [G, N, K] with trans_b) in a's
    dtype, offs int32 [G];
  FP8 (4 inputs, trans_b only): a [rows, K], b FP8 e4m3 [G, N, K], offs int32 [G],
    b_scale float32 [G, N]; the activations are quantized per row at run time
    into the plugin's workspace (fp8_workspace_bytes for the profile's max rows).
    With attribute activation 1, a is a gate+up output [rows, 2K] and what is
    quantized is its SwiGLU (plugin_names.ACTIVATIONS).
It serializes the fields the C++ plugin reads back when the engine is loaded
(schema.fbs, table Engine): `trans_b` (kINT32, 1), `kernel_images_id`
(kUNKNOWN, 32 bytes, the sha256 of the blob's concatenated kernel images) and
`activation` (kINT32, 1).
It cannot run: engines run in the C++ runtime, which loads its own plugin.

The classes derive from the builder module's plugin interfaces, so they are
made per module (TensorRT or TensorRT for RTX) by `plugin_classes`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType

import numpy as np

from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.plugin_names import (
    ACTIVATION_ATTRIBUTE,
    ACTIVATIONS,
    FP8_WEIGHT_ONNX_TYPE,
    GROUPED_MM_OP,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
)

logger = logging.getLogger(__name__)

TRANS_B_FIELD = "trans_b"
ACTIVATION_FIELD = ACTIVATION_ATTRIBUTE
KERNEL_IMAGES_ID_FIELD = "kernel_images_id"
KERNEL_IMAGES_ID_BYTES = 32
DENSE_INPUTS, FP8_INPUTS = 3, 4  # (a, b, offs); (a, b FP8, offs, b_scale)
# The run-time workspace's layout (GroupedMMLauncher::fp8_workspace_bytes): a_q at 0, a_scale at the next multiple
# of FP8_WORKSPACE_ALIGNMENT. The plugin asks this much more, to align TensorRT's pointer itself (TensorRT does not
# document the alignment of a plugin's workspace).
FP8_WORKSPACE_ALIGNMENT = 256

# One GroupedMM creator per registry at a time: registering is global to the process.
_registry_lock = threading.Lock()


class PluginFieldError(ValueError):
    """A GroupedMM node or engine carries a field the plugin cannot take; the message names it."""


def kernel_images_id(kernels: Sequence[KernelImage]) -> bytes:
    """The reference a GroupedMM plugin serializes: sha256 of the kernels' images, concatenated in blob order."""
    digest = hashlib.sha256()
    for kernel in kernels:
        digest.update(kernel.image.bytes())
    return digest.digest()


def kernel_dtypes(kernels: Sequence[KernelImage], trans_b: bool, weight_format: str = "dense") -> frozenset[str]:
    """The dtypes ("bf16", "fp16") there are images for in this layout and weight format ("dense", "fp8")."""
    return frozenset(k.dtype for k in kernels if k.trans_b == trans_b and k.weight_format == weight_format)


def fp8_workspace_bytes(rows: int, k: int) -> int:
    """The FP8 form's run-time workspace for `rows` rows of K (GroupedMMLauncher::fp8_workspace_bytes, the same
    formula): a_q e4m3 [rows, K], then a_scale float32 [rows] at the next 256-byte boundary."""
    return -(-rows * k // FP8_WORKSPACE_ALIGNMENT) * FP8_WORKSPACE_ALIGNMENT + 4 * rows


def workspace_bytes(max_rows: int, k: int, fp8: bool) -> int:
    """What a GroupedMM plugin asks TensorRT for: nothing for the dense form; for the FP8 form its workspace
    at the profile's max rows, plus the slack to align TensorRT's pointer (the C++ plugin's getWorkspaceSize;
    an engine records the size its build asked for)."""
    return fp8_workspace_bytes(max_rows, k) + FP8_WORKSPACE_ALIGNMENT - 1 if fp8 else 0


def form_refusal(trt: ModuleType, input_types: Sequence, trans_b: bool, kernel_types: dict[str, frozenset[str]],
                 activation: int = ACTIVATIONS["none"]) -> str | None:
    """Why a GroupedMM node of these input types cannot be served (the C++ plugin's getOutputDataTypes refuses
    the same), or None. `kernel_types`: the dtypes there are images for, per weight format, in this layout."""
    names = {trt.bfloat16: "bf16", trt.float16: "fp16"}
    if len(input_types) not in (DENSE_INPUTS, FP8_INPUTS):
        return (f"GroupedMM takes {DENSE_INPUTS} inputs (a, b, offs) or {FP8_INPUTS} (a, b FP8, offs, b_scale); "
                f"the node has {len(input_types)}")
    fp8 = len(input_types) == FP8_INPUTS
    if not fp8 and activation != ACTIVATIONS["none"]:
        return f"activation={activation} (a gate+up output as a) is the FP8 form's only (4 inputs); the node has 3"
    if fp8:
        if not trans_b:
            return "the FP8 form (4 inputs) needs trans_b=1: its weights are [G, N, K]; the node has trans_b=0"
        if input_types[1] != trt.fp8:
            return (f"the FP8 form's b (input 1) must be {FP8_WEIGHT_ONNX_TYPE} (TensorRT FP8) [G, N, K]; it is "
                    f"{input_types[1].name}")
        if input_types[3] != trt.float32:
            return f"the FP8 form's b_scale (input 3) must be float32 [G, N]; it is {input_types[3].name}"
    weight_format = "fp8" if fp8 else "dense"
    if names.get(input_types[0]) not in kernel_types[weight_format]:
        return (f"the blob has no {names.get(input_types[0], input_types[0].name)}"
                f"{' FP8' if fp8 else ''} kernel image for trans_b={int(trans_b)} (it has "
                f"{', '.join(sorted(kernel_types[weight_format])) or 'none'}); the node's inputs must be of those")
    return None


def read_fields(trt: ModuleType, fields) -> dict[str, object]:
    """{trans_b: bool, activation: int, kernel_images_id: bytes | None} from a PluginFieldCollection;
    PluginFieldError if a field is unknown, of the wrong type or size (the C++ creator's contract). activation
    is 0 (none) where absent."""
    values: dict[str, object] = {TRANS_B_FIELD: None, ACTIVATION_FIELD: ACTIVATIONS["none"],
                                 KERNEL_IMAGES_ID_FIELD: None}
    for field in fields:
        data = np.asarray(field.data)
        if field.name in (TRANS_B_FIELD, ACTIVATION_FIELD):
            allowed = [0, 1] if field.name == TRANS_B_FIELD else sorted(ACTIVATIONS.values())
            if field.type not in (trt.PluginFieldType.INT32, trt.PluginFieldType.INT64) or data.size != 1 \
                    or int(data.reshape(-1)[0]) not in allowed:
                raise PluginFieldError(f"field {field.name} must be one integer, "
                                       f"{', '.join(map(str, allowed[:-1]))} or {allowed[-1]}; got "
                                       f"{field.type.name} {data.reshape(-1).tolist()}")
            value = int(data.reshape(-1)[0])
            values[field.name] = bool(value) if field.name == TRANS_B_FIELD else value
        elif field.name == KERNEL_IMAGES_ID_FIELD:
            raw = data.tobytes()
            if field.type != trt.PluginFieldType.UNKNOWN or len(raw) != KERNEL_IMAGES_ID_BYTES:
                raise PluginFieldError(f"field {KERNEL_IMAGES_ID_FIELD} must be {KERNEL_IMAGES_ID_BYTES} bytes "
                                       f"(UNKNOWN); got {field.type.name}, {len(raw)} bytes")
            values[KERNEL_IMAGES_ID_FIELD] = raw
        else:
            raise PluginFieldError(f"unknown field {field.name!r}; GroupedMM takes {TRANS_B_FIELD}, "
                                   f"{ACTIVATION_FIELD} and {KERNEL_IMAGES_ID_FIELD}")
    if values[TRANS_B_FIELD] is None:
        raise PluginFieldError(f"field {TRANS_B_FIELD} is missing (the ONNX node's attribute)")
    return values


def serialized_fields(trt: ModuleType, trans_b: bool, images_id: bytes, activation: int = ACTIVATIONS["none"]):
    """The PluginFieldCollection a GroupedMM plugin serializes into an engine (the C++ plugin's fields, in its
    order)."""
    return trt.PluginFieldCollection([
        trt.PluginField(TRANS_B_FIELD, np.array([int(trans_b)], dtype=np.int32), trt.PluginFieldType.INT32),
        trt.PluginField(KERNEL_IMAGES_ID_FIELD, np.frombuffer(images_id, dtype=np.uint8).copy(),
                        trt.PluginFieldType.UNKNOWN),
        trt.PluginField(ACTIVATION_FIELD, np.array([activation], dtype=np.int32), trt.PluginFieldType.INT32),
    ])


@functools.cache
def plugin_classes(trt: ModuleType) -> tuple[type, type]:
    """(plugin, creator) classes deriving from `trt`'s IPluginV3 interfaces."""
    dtypes = {"bf16": trt.bfloat16, "fp16": trt.float16}

    class GroupedMMPlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self, trans_b: bool, activation: int, images_id: bytes, kernel_types: dict[str, frozenset[str]],
                     refusals: list[str]):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_version, self.plugin_namespace = GROUPED_MM_OP, PLUGIN_VERSION, \
                PLUGIN_NAMESPACE
            self.num_outputs = 1
            self.trans_b, self.activation, self.images_id, self.kernel_types = trans_b, activation, images_id, \
                kernel_types
            self.types = {form: {dtypes[t] for t in types} for form, types in kernel_types.items()}
            self.refusals = refusals  # the creator's: why this plugin refused its inputs

        def get_capability_interface(self, kind):
            return self

        def clone(self):
            return GroupedMMPlugin(self.trans_b, self.activation, self.images_id, self.kernel_types, self.refusals)

        def get_output_data_types(self, input_types):
            # Refused here, while parsing, rather than by supports_format_combination while building: a
            # build that finds no format for a Python plugin can abort the process (TensorRT for RTX 1.7).
            refusal = form_refusal(trt, input_types, self.trans_b, self.kernel_types, self.activation)
            if refusal is not None:
                self.refusals.append(f"GroupedMM: {refusal}")
                raise ValueError(self.refusals[-1])
            return [input_types[0]]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            if len(inputs) not in (DENSE_INPUTS, FP8_INPUTS) or len(inputs[0]) != 2 or len(inputs[1]) != 3:
                raise ValueError("GroupedMM expects a [rows, K], b [G, K, N] or [G, N, K], offs [G] "
                                 "(and b_scale [G, N] in the FP8 form)")
            if len(inputs) == FP8_INPUTS:
                self._check_scale_shape(inputs[1], inputs[3])
            out = trt.DimsExprs(2)
            out[0] = inputs[0][0]
            out[1] = inputs[1][1 if self.trans_b else 2]
            return [out]

        def _check_scale_shape(self, b, scale):
            """b_scale must be [G, N] of b [G, N, K] (both are weights: their sizes are known while parsing)."""
            def sizes(dims) -> str:
                return "[" + ", ".join(str(d.get_constant_value()) if d.is_constant() else "?" for d in dims) + "]"

            if len(scale) != 2 or any(not (s.is_constant() and w.is_constant()) or
                                      s.get_constant_value() != w.get_constant_value()
                                      for s, w in zip(scale, (b[0], b[1]))):
                self.refusals.append(f"GroupedMM: the FP8 form's b_scale (input 3) must be [G, N] of b "
                                     f"{sizes(b)}; it is {sizes(scale)}")
                raise ValueError(self.refusals[-1])

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            fp8 = num_inputs == FP8_INPUTS
            if pos == 0:
                return desc.type in self.types["fp8" if fp8 else "dense"]
            if pos == 2:
                return desc.type == trt.int32
            if fp8 and pos == 1:
                return desc.type == trt.fp8
            if fp8 and pos == 3:
                return desc.type == trt.float32
            return desc.type == in_out[0].desc.type  # dense b, and out, in a's dtype

        def configure_plugin(self, inputs, outputs):
            pass

        def get_workspace_size(self, inputs, outputs):
            # The profile's largest rows, and b's K (a holds 2K where it is a gate+up output).
            return workspace_bytes(inputs[0].max[0], inputs[1].max[2 if self.trans_b else 1],
                                   len(inputs) == FP8_INPUTS)

        def get_fields_to_serialize(self):
            return serialized_fields(trt, self.trans_b, self.images_id, self.activation)

        def on_shape_change(self, inputs, outputs):
            pass

        def set_tactic(self, tactic):
            pass

        def attach_to_context(self, context):
            return self.clone()

        def enqueue(self, *args):
            raise RuntimeError("the Python GroupedMM plugin only builds engines; they run in et-trt's C++ runtime")

    class GroupedMMCreator(trt.IPluginCreatorV3One):
        """Creates plugins for one blob's kernel images (those the ONNX's GroupedMM nodes refer to)."""

        def __init__(self, kernels: Sequence[KernelImage]):
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_version, self.plugin_namespace = GROUPED_MM_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE
            # The fields an ONNX node supplies, as the C++ creator declares them; kernel_images_id comes from
            # the blob at parse time and from the plan at run time.
            self.field_names = trt.PluginFieldCollection([
                trt.PluginField(TRANS_B_FIELD, np.array([], dtype=np.int32), trt.PluginFieldType.INT32),
                trt.PluginField(ACTIVATION_FIELD, np.array([], dtype=np.int32), trt.PluginFieldType.INT32)])
            self.kernels = list(kernels)
            self.images_id = kernel_images_id(self.kernels)
            self.refusals: list[str] = []  # why create_plugin refused, for the build's report

        def create_plugin(self, name, fields, phase):
            try:
                values = read_fields(trt, fields)
                images_id = values[KERNEL_IMAGES_ID_FIELD]
                if images_id is not None and images_id != self.images_id:
                    raise PluginFieldError(f"{KERNEL_IMAGES_ID_FIELD} {images_id.hex()[:16]}... names other "
                                           f"kernel images than this blob's ({self.images_id.hex()[:16]}...)")
                trans_b = values[TRANS_B_FIELD]
                kernel_types = {form: kernel_dtypes(self.kernels, trans_b, form) for form in ("dense", "fp8")}
                if not any(kernel_types.values()):
                    raise PluginFieldError(f"the blob has no kernel image for trans_b={int(trans_b)}; re-export with "
                                           "grouped_gemm_kernel on")
            except PluginFieldError as e:
                message = f"GroupedMM node {name!r}: {e}"
                logger.error("%s", message)
                self.refusals.append(message)
                return None
            return GroupedMMPlugin(trans_b, values[ACTIVATION_FIELD], self.images_id, kernel_types, self.refusals)

    return GroupedMMPlugin, GroupedMMCreator


@contextlib.contextmanager
def registered(trt: ModuleType, kernels: Sequence[KernelImage]) -> Iterator[object]:
    """The Python GroupedMM creator for `kernels`, registered in `trt`'s plugin registry while inside;
    yields the creator (its `refusals` say why a node was refused)."""
    _, creator_class = plugin_classes(trt)
    creator = creator_class(kernels)
    registry = trt.get_plugin_registry()
    with _registry_lock:
        if not registry.register_creator(creator, PLUGIN_NAMESPACE):
            raise RuntimeError(f"another {PLUGIN_NAMESPACE}::{GROUPED_MM_OP} v{PLUGIN_VERSION} plugin creator is "
                               "registered in this process (the C++ plugin library?); build with one of them")
        try:
            yield creator
        finally:
            registry.deregister_creator(creator)
