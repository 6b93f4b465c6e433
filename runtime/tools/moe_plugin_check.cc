// C entry points for the device check of the MoEExperts plugin's runtime path without TensorRT
// (moe_plugin_check.py): a blob written by our export is read and verified by the runtime's blob reader with
// its named data, its kernel images registered as init registers them, and the plugin is driven through its
// IPluginV3 interfaces in the order TensorRT calls them: created from an ONNX node's attributes while parsing
// (the blob's images), its fields serialized into the engine and created again from them when the engine is
// deserialized (the images found by their id), attached to an execution context, told the shapes, asked its
// workspace, enqueued. TensorRT's interfaces are header-only, so no TensorRT library is loaded.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check_blob.h"
#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "moe_experts_plugin.h"

namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity, const char* message) noexcept override { text += std::string(message) + "\n"; }
  std::string text;
};

Logger& logger() {
  static Logger* instance = new Logger;  // the plugins keep the pointer for the process
  return *instance;
}

struct PluginCheck {
  std::shared_ptr<const et_trt::KernelPack> images;
  int32_t group_size = 0;  // the node's: > 0, INT4 weights
  std::unique_ptr<nvinfer1::IPluginV3> plugin;  // the execution context's, as attachToContext made it
};

using et_trt::tools::copy_error;

std::string refusal(const std::string& what) {
  std::string logged;
  logged.swap(logger().text);
  return what + (logged.empty() ? "" : ": " + logged);
}

nvinfer1::IPluginV3OneRuntime* runtime(nvinfer1::IPluginV3& plugin) {
  return static_cast<nvinfer1::IPluginV3OneRuntime*>(
      plugin.getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME));
}

// The plugin's tensors, as TensorRT describes them: dims [T, H], [T, k], [T, k], [E, N1, H], [E, H, F], [E, N1],
// [E, H] (INT4, `group_size` > 0: the weights packed, [E, N1, round_up(H, 32) / 2] and [E, H, round_up(F, 32) / 2],
// then their scales [E, N1, ceil(H / g)] and [E, H, ceil(F / g)]; FP8, 9 inputs and group_size 0: the scales
// [E, N1] and [E, H]), then the output [T, H]; `types` the inputs' (DataType values), the output's hidden's.
void describe(int64_t t, int64_t k, int64_t e, int64_t h, int64_t n1, int64_t f, int32_t group_size,
              const int32_t* types, int32_t nb, std::vector<nvinfer1::PluginTensorDesc>* in,
              nvinfer1::PluginTensorDesc* out) {
  const auto row = [&](int64_t k_in) { return group_size > 0 ? (k_in + 31) / 32 * 16 : k_in; };
  const auto groups = [&](int64_t k_in) { return group_size > 0 ? (k_in + group_size - 1) / group_size : 0; };
  const bool int4 = group_size > 0;
  std::vector<std::vector<int64_t>> dims = {{t, h}, {t, k}, {t, k}, {e, n1, row(h)}, {e, h, row(f)}, {e, n1}, {e, h},
                                            {e, n1, groups(h)}, {e, h, groups(f)}};
  if (!int4) {  // FP8: a scale per output channel
    dims[7].pop_back();
    dims[8].pop_back();
  }
  in->assign(static_cast<size_t>(nb), nvinfer1::PluginTensorDesc{});
  for (int32_t i = 0; i < nb; ++i) {
    nvinfer1::PluginTensorDesc& d = (*in)[static_cast<size_t>(i)];
    d.dims.nbDims = static_cast<int32_t>(dims[static_cast<size_t>(i)].size());
    for (int32_t j = 0; j < d.dims.nbDims; ++j) d.dims.d[j] = dims[static_cast<size_t>(i)][static_cast<size_t>(j)];
    d.type = static_cast<DataType>(types[i]);
    d.format = nvinfer1::TensorFormat::kLINEAR;
  }
  *out = (*in)[0];
}

}  // namespace

extern "C" {

// `blob_bytes` and its named data as `count` (key, bytes, size) entries; the MoEExperts node's attributes
// (group_size 0 where its weights are not INT4).
__attribute__((visibility("default"))) void* et_trt_moe_plugin_check_create(
    const uint8_t* blob_bytes, size_t size, const char* const* keys, const uint8_t* const* data, const size_t* sizes,
    size_t count, int32_t activation, const char* gate_up_layout, float alpha, float limit, int32_t group_size,
    char* error, size_t error_size) {
  auto check = std::make_unique<PluginCheck>();
  check->images = et_trt::tools::register_blob_images(blob_bytes, size, keys, data, sizes, count, error, error_size);
  if (check->images == nullptr) return nullptr;
  et_trt::set_grouped_mm_logger(&logger());
  const std::string layout = gate_up_layout != nullptr ? gate_up_layout : "";
  check->group_size = group_size;
  PluginField node[5] = {PluginField("activation", &activation, PluginFieldType::kINT32, 1),
                         PluginField("gate_up_layout", layout.data(), PluginFieldType::kCHAR,
                                     static_cast<int32_t>(layout.size())),
                         PluginField("alpha", &alpha, PluginFieldType::kFLOAT32, 1),
                         PluginField("limit", &limit, PluginFieldType::kFLOAT32, 1),
                         PluginField("group_size", &group_size, PluginFieldType::kINT32, 1)};
  const nvinfer1::PluginFieldCollection attributes{5, node};
  std::unique_ptr<nvinfer1::IPluginV3> parsed;
  {
    et_trt::KernelImagesForParsing parsing(check->images);
    parsed.reset(et_trt::moe_experts_creator().createPlugin("moe", &attributes, nvinfer1::TensorRTPhase::kBUILD));
  }
  if (parsed == nullptr) {
    copy_error(refusal("the plugin refused the node's attributes"), error, error_size);
    return nullptr;
  }
  // The engine's copy: what getFieldsToSerialize gives, read back at deserialization with no images being parsed.
  std::unique_ptr<nvinfer1::IPluginV3> deserialized(et_trt::moe_experts_creator().createPlugin(
      "moe", runtime(*parsed)->getFieldsToSerialize(), nvinfer1::TensorRTPhase::kRUNTIME));
  if (deserialized == nullptr) {
    copy_error(refusal("the plugin refused its own serialized fields"), error, error_size);
    return nullptr;
  }
  check->plugin.reset(runtime(*deserialized)->attachToContext(nullptr));
  if (check->plugin == nullptr) {
    copy_error("attachToContext returned no plugin", error, error_size);
    return nullptr;
  }
  return check.release();
}

// getWorkspaceSize for these shapes (min = opt = max) and input types (`nb` inputs, DataType values).
__attribute__((visibility("default"))) size_t et_trt_moe_plugin_check_workspace_bytes(
    void* handle, int64_t t, int64_t k, int64_t e, int64_t h, int64_t n1, int64_t f, const int32_t* types,
    int32_t nb) {
  auto* check = static_cast<PluginCheck*>(handle);
  std::vector<nvinfer1::PluginTensorDesc> in;
  nvinfer1::PluginTensorDesc out{};
  describe(t, k, e, h, n1, f, check->group_size, types, nb, &in, &out);
  std::vector<nvinfer1::DynamicPluginTensorDesc> dynamic(in.size());
  for (size_t i = 0; i < in.size(); ++i) dynamic[i] = {in[i], in[i].dims, in[i].dims, in[i].dims};
  nvinfer1::DynamicPluginTensorDesc dynamic_out{out, out.dims, out.dims, out.dims};
  auto* build = static_cast<nvinfer1::IPluginV3OneBuild*>(
      check->plugin->getCapabilityInterface(nvinfer1::PluginCapabilityType::kBUILD));
  return build->getWorkspaceSize(dynamic.data(), nb, &dynamic_out, 1);
}

// onShapeChange, then enqueue on `stream` with `inputs` (`nb` device pointers), `out` and `workspace`.
__attribute__((visibility("default"))) int32_t et_trt_moe_plugin_check_enqueue(
    void* handle, int64_t t, int64_t k, int64_t e, int64_t h, int64_t n1, int64_t f, const int32_t* types,
    int32_t nb, const void* const* inputs, void* out_ptr, void* workspace, void* stream, char* error,
    size_t error_size) {
  auto* check = static_cast<PluginCheck*>(handle);
  std::vector<nvinfer1::PluginTensorDesc> in;
  nvinfer1::PluginTensorDesc out{};
  describe(t, k, e, h, n1, f, check->group_size, types, nb, &in, &out);
  nvinfer1::IPluginV3OneRuntime* rt = runtime(*check->plugin);
  if (rt->onShapeChange(in.data(), nb, &out, 1) != 0) {
    copy_error(refusal("onShapeChange refused the shapes"), error, error_size);
    return 1;
  }
  void* outputs[1] = {out_ptr};
  if (rt->enqueue(in.data(), &out, inputs, outputs, workspace, static_cast<cudaStream_t>(stream)) != 0) {
    copy_error(refusal("enqueue failed"), error, error_size);
    return 1;
  }
  return 0;
}

__attribute__((visibility("default"))) void et_trt_moe_plugin_check_destroy(void* handle) {
  delete static_cast<PluginCheck*>(handle);
}

}  // extern "C"
