// TensorRT plugin for the ONNX op et_trt::MoEExperts (issue 32; et_trt_backend/moe_experts.py holds its
// semantics): name "MoEExperts", namespace "et_trt", version "1". One node from the router's top-k to the
// combined output of a MoE block:
//   hidden [T, H] bf16 | fp16, topk_ids [T, k] int32, topk_weights [T, k] float32 or hidden's type,
//   w_gate_up [E, N1, H], w_down [E, H, F] (N1 = 2F for gated activations, else F), optional b_gate_up [E, N1]
//   and b_down [E, H], all of hidden's type  ->  out [T, H] of hidden's type.
// Launched through et_trt::kernels::MoEExpertsLauncher with the blob's MoE kernel images of hidden's type and a
// workspace from TensorRT (MoEExpertsLauncher::workspace_bytes at the profile's max T).
//
// Fields (the ONNX node's attributes, plugin_names.MOE_*_ATTRIBUTE): `activation` (kINT32, MoEActivation),
// `gate_up_layout` (kCHAR, "concat" | "interleaved" | "blocked8"), `alpha` and `limit` (kFLOAT32, gptoss_glu's);
// serialized with `kernel_images_id` (kUNKNOWN, 32 bytes), resolved as GroupedMM's is (grouped_mm_plugin.h).
//
// Compiled into libet_trt_runtime.so (the delegate registers the creator) and into libet_trt_plugin.so.
#pragma once

#include <NvInfer.h>

#include <string>

namespace et_trt {

constexpr char kMoEExpertsName[] = "MoEExperts";
constexpr char kMoEExpertsNamespace[] = "et_trt";
constexpr char kMoEExpertsVersion[] = "1";
constexpr char kMoEActivationField[] = "activation";
constexpr char kMoELayoutField[] = "gate_up_layout";
constexpr char kMoEAlphaField[] = "alpha";
constexpr char kMoELimitField[] = "limit";

// The creator, one per process (lives as long as the process, like a registry).
nvinfer1::IPluginCreatorV3One& moe_experts_creator();

// Registers the creator with TensorRT's registry (once per registry).
bool register_moe_experts_plugin(nvinfer1::IPluginRegistry& registry, std::string* error);

}  // namespace et_trt
