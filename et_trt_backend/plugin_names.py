"""The names through which TensorRT finds our GroupedMM and MoEExperts plugins (contract 4): the one definition.

TensorRT's ONNX parser turns a node of op type GROUPED_MM_OP (MOE_EXPERTS_OP) into the plugin
registered under that name, the node's plugin_version and its
plugin_namespace (PLUGIN_ATTRIBUTES). The lowering writes such nodes in
domain GROUPED_MM_DOMAIN and the pre-flight check verifies them. The C++ plugins declare
the same names (kGroupedMMName, kGroupedMMVersion, kGroupedMMNamespace in
runtime/src/tensorrt/grouped_mm_plugin.h; kMoEExperts* in moe_experts_plugin.h) and register their creators
under them.
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

# The INT4 form of both ops (expert_precision = "int4", et_trt_backend/int4_weights.py): an int attribute, written on
# every GroupedMM and MoEExperts node (0 on the others), holding the INT4 scale groups' size along K (32, 64 or 128).
# Nonzero, the node's weights are packed INT4 (INT8 [G, N, round_up(K, 32) / 2]) with bfloat16 scales
# [G, N, ceil(K / group_size)]: GroupedMM's 4th input b_scale; MoEExperts' inputs 7 and 8 (w_gate_up_scale,
# w_down_scale), after both biases (zeros where the model has none). The C++ plugins' kGroupSizeField is the same.
INT4_GROUP_SIZE_ATTRIBUTE = "group_size"
# The ONNX element type of packed INT4 weights (a name of onnx.TensorProto.DataType): their bytes, typed INT8, which
# TensorRT for RTX 1.7.1's parser hands a plugin verbatim as kINT8 (as it does FP8 bits typed INT8); a UINT8
# initializer it converts to INT32 ("UINT8 data ... is being converted to INT32", seen building for sm_80 and sm_120).
INT4_WEIGHT_ONNX_TYPE = "INT8"

# The fused MoE experts op (issue 32; /work contract "MoEExperts"): one node from top-k ids to the combined output.
# Domain GROUPED_MM_DOMAIN, plugin attributes PLUGIN_ATTRIBUTES; et_trt_backend/moe_experts.py holds its semantics.
MOE_EXPERTS_OP = "MoEExperts"
# Its int attribute "activation": gated ones take a gate+up output of 2F columns (gate g, up u), the others F.
# The C++ mirror is enum class MoEActivation in runtime/kernels/moe_experts_launcher.h (tests/test_moe_experts.py
# checks they agree).
MOE_ACTIVATIONS = {
    "swiglu": 0,  # silu(g) * u
    "geglu_tanh": 1,  # gelu(g, tanh approximation) * u
    "geglu_erf": 2,  # gelu(g) * u
    "gptoss_glu": 3,  # GPT-OSS: g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g)
    "silu": 4,
    "gelu_tanh": 5,
    "gelu_erf": 6,
    "relu2": 7,  # relu(x)^2
}
MOE_GATED_ACTIVATIONS = ("swiglu", "geglu_tanh", "geglu_erf", "gptoss_glu")
# Its string attribute "gate_up_layout": where a gated activation's gate and up rows of feature f lie among the
# 2F rows of w_gate_up[e]. "concat": f and F + f; "interleaved": 2f and 2f + 1 (GPT-OSS); "blocked8": in blocks of
# 16 rows, 8 gate rows then the same 8 features' up rows, 16 (f // 8) + f % 8 and that + 8 (F % 8 == 0 only): the
# layout the kernels read fastest (the sm_90a kernel holds both rows of a feature in one thread); the lowering
# reorders the rows at export and records it. Each is a block size B (moe_experts.layout_block): gate row
# (f // B) * 2B + f % B, up row that + B; concat's B is F, interleaved's 1.
MOE_GATE_UP_LAYOUTS = ("concat", "interleaved", "blocked8")
# The MoEExperts node's attributes, each written on every node (NVIDIA's parser warns of a plugin field a node
# lacks), which the plugin reads as its fields (kMoEActivationField, kMoELayoutField, kMoEAlphaField and
# kMoELimitField in runtime/src/tensorrt/moe_experts_plugin.h): activation, an int of MOE_ACTIVATIONS;
# gate_up_layout, a string of MOE_GATE_UP_LAYOUTS; alpha and limit, gptoss_glu's floats. Plus PLUGIN_ATTRIBUTES:
# the plugin is et_trt::MoEExperts, version PLUGIN_VERSION, like GroupedMM, in GROUPED_MM_DOMAIN.
MOE_ACTIVATION_ATTRIBUTE = "activation"
MOE_LAYOUT_ATTRIBUTE = "gate_up_layout"
MOE_ALPHA_ATTRIBUTE = "alpha"
MOE_LIMIT_ATTRIBUTE = "limit"
