// libet_trt_plugin.so: the GroupedMM and MoEExperts plugins alone, as a TensorRT
// plugin library, so a TensorRT or TensorRT for RTX builder process (e.g. Python:
// builder.get_plugin_registry().load_library(path)) runs our real C++ plugin.
// Entry points: getCreators and setLoggerFinder (TensorRT's plugin-library
// convention), and et_trt_plugin_use_kernel_images, which hands the plugin a
// blob's kernel images (named data, passed by the caller) before its ONNX is
// parsed or its engine deserialized.
#include <NvInfer.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "blob_reader.h"
#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "moe_experts_plugin.h"
#include "named_data.h"

#define ET_TRT_EXPORT extern "C" __attribute__((visibility("default")))

ET_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  et_trt::set_grouped_mm_logger(finder != nullptr ? finder->findLogger() : nullptr);
}

ET_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nb_creators) {
  static nvinfer1::IPluginCreatorInterface* const creators[] = {&et_trt::grouped_mm_creator(),
                                                                 &et_trt::moe_experts_creator()};
  nb_creators = 2;
  return creators;
}

// Verifies `blob` (a whole et-trt delegate blob) and its named data, passed as
// `count` (key, bytes, size) entries (at least its kernel images), registers
// its kernel images for the life of the process and makes them the images
// GroupedMM and MoEExperts nodes parsed from ONNX on the calling thread take, until the next
// call. Deserialized engines find them by their kernel_images_id. Writes that
// id (32 bytes) to `id` if not null. Returns 0, or 1 with `error` filled.
ET_TRT_EXPORT int32_t et_trt_plugin_use_kernel_images(const uint8_t* blob, size_t size, const char* const* keys,
                                                      const uint8_t* const* data, const size_t* sizes, size_t count,
                                                      uint8_t* id, char* error, size_t error_size) {
  const auto refuse = [&](const std::string& message) {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
    return 1;
  };
  std::vector<uint64_t> aligned;
  et_trt::BlobView view;
  et_trt::BlobError blob_error;
  if (!et_trt::read_blob_copy(blob, size, &aligned, &view, &blob_error)) {
    return refuse("blob refused: " + blob_error.message);
  }
  et_trt::PartitionData named;
  std::string data_error;
  if (!et_trt::fetch_named_data(*view.root, et_trt::CallerNamedData(keys, data, sizes, count), &named,
                                &data_error)) {
    return refuse(data_error);
  }
  auto images = et_trt::register_kernel_images(*view.root, named.kernel_images);
  static std::mutex mutex;
  static auto* pinned = new std::vector<std::shared_ptr<const et_trt::KernelPack>>;
  {
    std::lock_guard<std::mutex> lock(mutex);
    pinned->push_back(images);
  }
  if (id != nullptr) std::memcpy(id, images->id().data(), images->id().size());
  et_trt::set_parsing_kernel_images(std::move(images));
  return 0;
}
