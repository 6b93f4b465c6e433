"""The names through which TensorRT finds our GroupedMM plugin (contract 4): the one definition.

TensorRT's ONNX parser turns a node of op type GROUPED_MM_OP into the plugin
registered under that name, the node's plugin_version and its
plugin_namespace (PLUGIN_ATTRIBUTES). The lowering writes such nodes in
domain GROUPED_MM_DOMAIN, the Python build phase registers its creator under
these names, and the pre-flight check verifies both. The C++ plugin declares
the same names (kGroupedMMName, kGroupedMMVersion, kGroupedMMNamespace in
runtime/src/tensorrt/grouped_mm_plugin.h).
"""

GROUPED_MM_DOMAIN = "et_trt"
GROUPED_MM_OP = "GroupedMM"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "et_trt"

# The node attributes that name the plugin, with the values they must have.
PLUGIN_ATTRIBUTES = {"plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}

# What a GroupedMM node's input a is (its int attribute ACTIVATION_ATTRIBUTE, 0 where absent): "none", the
# activations; "swiglu" (the FP8 form only), a gate+up output [rows, 2K] whose SwiGLU
# silu(a[:, :K]) * a[:, K:] is quantized and multiplied (lowering/fp8_swiglu.py). The C++ plugin's
# kActivationField, kActivationNone and kActivationSwiGLU (runtime/src/tensorrt/grouped_mm_plugin.h) are the same.
ACTIVATION_ATTRIBUTE = "activation"
ACTIVATIONS = {"none": 0, "swiglu": 1}

# The ONNX element type of the FP8 form's weights (input 1 of a 4-input GroupedMM node; TensorRT's kFP8), a name of
# onnx.TensorProto.DataType. Chosen by building both candidates with TensorRT for RTX 1.7.1 (parser and builder,
# SM89 and SM120, the initializer inline and through IParser::loadInitializer): a FLOAT8E4M3FN initializer
# [G, N, K] reaches the plugin as kFP8 and an INT8 one carrying the e4m3 bits as kINT8, both with 0 parser
# errors, 0 builder errors or warnings and the weight bytes verbatim in the plan. So the weights carry their own
# type, and an INT8 tensor is never mistaken for FP8 bits; onnx-tensorrt maps FLOAT8E4M3FN to kFP8 as well.
FP8_WEIGHT_ONNX_TYPE = "FLOAT8E4M3FN"
