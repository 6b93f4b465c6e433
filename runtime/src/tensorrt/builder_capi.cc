#include "builder_capi.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "gpu_device.h"
#include "io_spec.h"
#include "named_data.h"
#include "tensorrt_builder.h"
#include "tensorrt_library.h"

#define ET_TRT_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using et_trt::Provider;

constexpr int32_t kBuilt = 0, kUnavailable = 1, kParseRefused = 2, kRefused = 3;
constexpr char kRecordSeparator = '\x1e';

std::atomic<et_trt_log_callback> callback{nullptr};

void to_callback(et_trt::LogLevel level, const char* message) {
  if (et_trt_log_callback forward = callback.load()) {
    forward(static_cast<int32_t>(level), message);
  } else if (level != et_trt::LogLevel::kVerbose) {
    std::fprintf(stderr, "%s\n", message);
  }
}

void copy_text(const std::string& text, char* out, size_t size) {
  if (out != nullptr && size > 0) std::snprintf(out, size, "%s", text.c_str());
}

bool provider_of(int32_t id, Provider* provider) {
  if (id != 0 && id != 1) return false;
  *provider = id == 0 ? Provider::kTensorRT : Provider::kTensorRTRTX;
  return true;
}

// The build for `provider`: TensorRT for the GPU `device` (its primary context current around the build),
// TensorRT for RTX ahead of time for `target`.
int32_t build(et_trt::TensorRTLibrary& trt, const et_trt::BlobView& view, const et_trt::PartitionData& named,
              int32_t target, int32_t device, const std::string& timing_cache, std::vector<uint8_t>* plan,
              std::string* gpu_name, int32_t* compute_capability, std::vector<std::string>* not_applied,
              std::string* error) {
  const et_trt::PartitionIo io = et_trt::partition_io(*view.root);
  et_trt::BuildRequest request{target, timing_cache};
  et_trt::BuildFailure failure;
  const auto failed = [&] {
    *error = failure.summary;
    for (const std::string& message : failure.errors) *error += kRecordSeparator + message;
    return failure.parsed ? kRefused : kParseRefused;
  };
  if (trt.provider() == Provider::kTensorRTRTX) {
    if (target <= 0) {
      *error = "TensorRT for RTX builds at export ahead of time: name a target compute capability";
      return kRefused;
    }
    if (!et_trt::build_plan(trt, view, io, named, request, plan, not_applied, &failure)) return failed();
    *compute_capability = target;
    return kBuilt;
  }
  if (target != 0) {
    *error = "TensorRT builds for the GPU it runs on, not for sm_" + std::to_string(target);
    return kRefused;
  }
  et_trt::GpuDevice gpu;
  std::string message;
  if (!et_trt::open_gpu_device(device, &gpu, &message)) {
    *error = "TensorRT is installed, but " + message;
    return kUnavailable;
  }
  CUcontext context;
  const CUresult r = gpu.cuda->cuDevicePrimaryCtxRetain(&context, gpu.device);
  if (r != CUDA_SUCCESS) {
    *error = gpu.cuda->describe("cuDevicePrimaryCtxRetain", r);
    return kUnavailable;
  }
  bool built;
  {
    et_trt::ScopedContext scope(*gpu.cuda, context);
    built = et_trt::build_plan(trt, view, io, named, request, plan, not_applied, &failure);
  }
  gpu.cuda->cuDevicePrimaryCtxRelease(gpu.device);
  if (!built) return failed();
  *gpu_name = gpu.name;
  *compute_capability = gpu.capability;
  return kBuilt;
}

}  // namespace

ET_TRT_EXPORT void et_trt_builder_set_log(et_trt_log_callback log) {
  callback.store(log);
  et_trt::TensorRTLogger::set_sink(&to_callback);
}

ET_TRT_EXPORT int32_t et_trt_builder_provider(int32_t provider_id, char* version, size_t version_size, char* error,
                                              size_t error_size) {
  Provider provider;
  if (!provider_of(provider_id, &provider)) {
    copy_text("unknown provider " + std::to_string(provider_id) + " (0 TensorRT, 1 TensorRT for RTX)", error,
              error_size);
    return kUnavailable;
  }
  std::string message;
  et_trt::TensorRTLibrary* trt = et_trt::TensorRTLibrary::get(provider, &message);
  if (trt == nullptr) {
    copy_text(message, error, error_size);
    return kUnavailable;
  }
  copy_text(trt->version(), version, version_size);
  return kBuilt;
}

ET_TRT_EXPORT int32_t et_trt_build_engine(const uint8_t* blob, size_t size, const char* const* keys,
                                          const uint8_t* const* data, const size_t* sizes, size_t count,
                                          int32_t provider_id, int32_t target, int32_t device,
                                          const char* timing_cache, uint8_t** plan, size_t* plan_size,
                                          char* gpu_name, size_t gpu_name_size, int32_t* compute_capability,
                                          char* not_applied, size_t not_applied_size, char* error,
                                          size_t error_size) {
  const auto refuse = [&](int32_t code, const std::string& message) {
    copy_text(message, error, error_size);
    return code;
  };
  Provider provider;
  if (!provider_of(provider_id, &provider)) {
    return refuse(kRefused, "unknown provider " + std::to_string(provider_id) + " (0 TensorRT, 1 TensorRT for RTX)");
  }
  std::vector<uint64_t> aligned;
  et_trt::BlobView view;
  et_trt::BlobError blob_error;
  if (!et_trt::read_blob_copy(blob, size, &aligned, &view, &blob_error)) {
    return refuse(kRefused, "blob refused: " + blob_error.message);
  }
  if (view.root->onnx() == nullptr || view.root->onnx()->size() == 0) {
    return refuse(kRefused, "the blob has no ONNX to build an engine from");
  }
  et_trt::PartitionData named;
  std::string message;
  if (!et_trt::fetch_named_data(*view.root, et_trt::CallerNamedData(keys, data, sizes, count), &named, &message)) {
    return refuse(kRefused, message);
  }
  et_trt::TensorRTLibrary* trt = et_trt::TensorRTLibrary::get(provider, &message);
  if (trt == nullptr) return refuse(kUnavailable, message);
  std::vector<uint8_t> bytes;
  std::string gpu;
  std::vector<std::string> notes;
  const int32_t code = build(*trt, view, named, target, device, timing_cache != nullptr ? timing_cache : "", &bytes,
                             &gpu, compute_capability, &notes, &message);
  if (code != kBuilt) return refuse(code, message);
  *plan = static_cast<uint8_t*>(std::malloc(bytes.size()));
  if (*plan == nullptr) return refuse(kRefused, "out of memory for the engine plan");
  std::memcpy(*plan, bytes.data(), bytes.size());
  *plan_size = bytes.size();
  copy_text(gpu, gpu_name, gpu_name_size);
  std::string lines;
  for (const std::string& note : notes) lines += note + "\n";
  copy_text(lines, not_applied, not_applied_size);
  return kBuilt;
}

ET_TRT_EXPORT void et_trt_free(void* pointer) { std::free(pointer); }
