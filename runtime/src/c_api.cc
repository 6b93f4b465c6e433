// C entry points of libet_trt_runtime.so for Python (et_trt_backend.runtime):
// export-time engine builds go through the same builder as init on the robot;
// data files are checked as et_trt_runner checks them.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "engine.h"
#include "et_trt/data_file.h"
#include "named_data.h"

namespace {

void copy_text(const std::string& text, char* out, size_t size) {
  if (out != nullptr && size > 0) std::snprintf(out, size, "%s", text.c_str());
}

}  // namespace

extern "C" {

// Builds the engine of a blob on CUDA device `device`, as init would, with its
// named data (weights) passed as `count` (key, bytes, size) entries and the
// timing cache at `timing_cache` (may be null or empty: none).
// Returns 0 and a malloc'd plan (free with et_trt_free); 1 when TensorRT, CUDA
// or a GPU is unavailable; 2 when the blob or its data is refused or the build
// fails. `error` gets the message.
__attribute__((visibility("default"))) int32_t et_trt_build_engine(
    const uint8_t* blob, size_t size, const char* const* keys, const uint8_t* const* data, const size_t* sizes,
    size_t count, const char* timing_cache, int32_t device, uint8_t** plan, size_t* plan_size,
    char* tensorrt_version, size_t tensorrt_version_size, char* gpu_name, size_t gpu_name_size,
    int32_t* compute_capability, char* error, size_t error_size) {
  std::vector<uint64_t> aligned;
  et_trt::BlobView view;
  et_trt::BlobError blob_error;
  if (!et_trt::read_blob_copy(blob, size, &aligned, &view, &blob_error)) {
    copy_text("blob refused: " + blob_error.message, error, error_size);
    return 2;
  }
  et_trt::PartitionData named;
  std::string data_error;
  if (!et_trt::fetch_named_data(*view.root, et_trt::CallerNamedData(keys, data, sizes, count), &named, &data_error)) {
    copy_text(data_error, error, error_size);
    return 2;
  }
  std::vector<uint8_t> bytes;
  et_trt::EngineTarget target;
  et_trt::EngineError engine_error;
  if (!et_trt::build_engine_plan(view, et_trt::partition_io(*view.root), named, device,
                                 timing_cache != nullptr ? timing_cache : "", &bytes, &target, &engine_error)) {
    copy_text(engine_error.message, error, error_size);
    return engine_error.kind == et_trt::EngineError::Kind::kUnavailable ? 1 : 2;
  }
  *plan = static_cast<uint8_t*>(std::malloc(bytes.size()));
  if (*plan == nullptr) {
    copy_text("out of memory for the engine plan", error, error_size);
    return 2;
  }
  std::memcpy(*plan, bytes.data(), bytes.size());
  *plan_size = bytes.size();
  copy_text(target.tensorrt_version, tensorrt_version, tensorrt_version_size);
  copy_text(target.gpu_name, gpu_name, gpu_name_size);
  *compute_capability = target.compute_capability;
  return 0;
}

__attribute__((visibility("default"))) void et_trt_free(void* pointer) { std::free(pointer); }

// et_trt::verify_data_file for Python (et_trt_backend.runtime.verify_data_file): 0 if the .ptd at `path` is safe
// to hand to ExecuTorch, else 1 with the one-line reason in `error`.
__attribute__((visibility("default"))) int32_t et_trt_verify_data_file(const char* path, char* error,
                                                                        size_t error_size) {
  std::string message;
  if (et_trt::verify_data_file(path, &message)) return 0;
  copy_text(message, error, error_size);
  return 1;
}

}  // extern "C"
