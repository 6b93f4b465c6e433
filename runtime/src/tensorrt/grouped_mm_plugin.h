// TensorRT plugin for the ONNX op et_trt::GroupedMM (contract 4): name
// "GroupedMM", namespace "et_trt", version "1". Inputs a [rows, K], b
// [G, K, N] (or [G, N, K] with trans_b), offs int32 [G]; output [rows, N].
// The kernel images travel in the plugin's fields, so a serialized engine
// carries them; they are launched through et_trt::kernels::GroupedMMLauncher.
#pragma once

#include <NvInfer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace et_trt {

constexpr char kGroupedMMName[] = "GroupedMM";
constexpr char kGroupedMMNamespace[] = "et_trt";
constexpr char kGroupedMMVersion[] = "1";

// Registers the plugin creator with TensorRT's registry (once per process).
bool register_grouped_mm_plugin(nvinfer1::IPluginRegistry& registry, std::string* error);

// While alive, GroupedMM plugins created on this thread from an ONNX node
// (which carries only trans_b) take their kernel images from `pack`
// (kernel_images.h). The engine builder holds one around parsing a blob's ONNX.
class KernelImagesForParsing {
 public:
  explicit KernelImagesForParsing(const std::vector<uint8_t>* pack);
  ~KernelImagesForParsing();
  KernelImagesForParsing(const KernelImagesForParsing&) = delete;
  KernelImagesForParsing& operator=(const KernelImagesForParsing&) = delete;
};

}  // namespace et_trt
