#include "grouped_mm_capi.h"

#include <algorithm>
#include <memory>
#include <string>

#include "capi_images.h"
#include "grouped_mm_launcher.h"

using et_trt::kernels::GroupedMMLauncher;
using et_trt::kernels::capi::copy_error;

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_images_for_gpu(const uint8_t* kernels, size_t kernels_size,
                                                                  int32_t cc, uint8_t* chosen, int32_t count,
                                                                  char* error, size_t error_size) {
  et_trt::kernels::capi::Images records;
  std::string message;
  if (!et_trt::kernels::capi::read_records(kernels, kernels_size, count, &records, &message)) {
    copy_error("grouped_mm: " + message, error, error_size);
    return 1;
  }
  std::fill(chosen, chosen + count, 0);
  for (const et_trt::kernels::KernelImageRef* ref : et_trt::kernels::images_for_gpu(records.refs, cc)) {
    chosen[ref - records.refs.data()] = 1;
  }
  return 0;
}

extern "C" ET_TRT_EXPORT void* et_trt_grouped_mm_create(const uint8_t* kernels, size_t kernels_size,
                                                        const uint8_t* const* images, const size_t* image_sizes,
                                                        int32_t count, char* error, size_t error_size) {
  const auto refuse = [&](const std::string& message) -> void* {
    copy_error("grouped_mm: " + message, error, error_size);
    return nullptr;
  };
  et_trt::kernels::capi::Images parsed;
  std::string message;
  if (!et_trt::kernels::capi::read_images(kernels, kernels_size, images, image_sizes, count, &parsed, &message))
    return refuse(message);
  std::unique_ptr<GroupedMMLauncher> launcher = GroupedMMLauncher::create(parsed.refs, &message);
  if (!launcher) {
    copy_error(message, error, error_size);
    return nullptr;
  }
  return launcher.release();
}

namespace {

int32_t launch(void* launcher, const void* a, const void* b, const int32_t* offs, void* out, int64_t rows, int64_t k,
               int64_t n, int64_t groups, int32_t trans_b, void* stream, const et_trt::kernels::Fp8Operands* fp8,
               const et_trt::kernels::Int4Operands* int4, char* error, size_t error_size) {
  if (launcher == nullptr) {
    copy_error("grouped_mm: null launcher", error, error_size);
    return 1;
  }
  std::string message;
  bool ok = static_cast<GroupedMMLauncher*>(launcher)->launch(a, b, offs, out, rows, k, n, groups, trans_b != 0,
                                                              static_cast<CUstream>(stream), &message, fp8,
                                                              nullptr, int4);
  if (!ok) copy_error(message, error, error_size);
  return ok ? 0 : 1;
}

}  // namespace

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch(void* launcher, const void* a, const void* b, const int32_t* offs,
                                            void* out, int64_t rows, int64_t k, int64_t n, int64_t groups,
                                            int32_t trans_b, void* stream, char* error, size_t error_size) {
  return launch(launcher, a, b, offs, out, rows, k, n, groups, trans_b, stream, nullptr, nullptr, error, error_size);
}

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch_fp8(void* launcher, const void* a, const void* b,
                                                              const int32_t* offs, void* out, int64_t rows, int64_t k,
                                                              int64_t n, int64_t groups, int32_t trans_b,
                                                              const float* b_scale, void* workspace,
                                                              size_t workspace_bytes, int32_t swiglu, void* stream,
                                                              char* error, size_t error_size) {
  const et_trt::kernels::Fp8Operands fp8{b_scale, workspace, workspace_bytes, swiglu != 0};
  return launch(launcher, a, b, offs, out, rows, k, n, groups, trans_b, stream, &fp8, nullptr, error, error_size);
}

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch_int4(void* launcher, const void* a, const void* b,
                                                               const int32_t* offs, void* out, int64_t rows, int64_t k,
                                                               int64_t n, int64_t groups, int32_t trans_b,
                                                               const void* b_scale, int64_t group_size, void* stream,
                                                               char* error, size_t error_size) {
  const et_trt::kernels::Int4Operands int4{b_scale, group_size};
  return launch(launcher, a, b, offs, out, rows, k, n, groups, trans_b, stream, nullptr, &int4, error, error_size);
}

extern "C" ET_TRT_EXPORT size_t et_trt_grouped_mm_fp8_workspace_bytes(int64_t rows, int64_t k) {
  return GroupedMMLauncher::fp8_workspace_bytes(rows, k);
}

extern "C" ET_TRT_EXPORT const char* et_trt_grouped_mm_last_kernel(void* launcher) {
  return launcher ? static_cast<GroupedMMLauncher*>(launcher)->last_kernel().c_str() : "";
}

extern "C" ET_TRT_EXPORT const char* et_trt_grouped_mm_last_quantize(void* launcher) {
  return launcher ? static_cast<GroupedMMLauncher*>(launcher)->last_quantize().c_str() : "";
}

extern "C" ET_TRT_EXPORT void et_trt_grouped_mm_destroy(void* launcher) { delete static_cast<GroupedMMLauncher*>(launcher); }
