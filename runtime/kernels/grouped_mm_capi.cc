#include "grouped_mm_capi.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "grouped_mm_launcher.h"

using et_trt::kernels::GroupedMMLauncher;

// The C ABI is this library's interface: exported also where the build hides symbols by
// default (runtime/CMakeLists.txt does, and builds this library as its subdirectory).
#define ET_TRT_EXPORT __attribute__((visibility("default")))

namespace {

void copy_error(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

const char* or_empty(const char* s) { return s ? s : ""; }

}  // namespace

extern "C" ET_TRT_EXPORT void* et_trt_grouped_mm_create(const EtTrtKernelImage* images, int32_t count, char* error,
                                          size_t error_size) {
  std::vector<et_trt::kernels::KernelImageView> views;
  for (int32_t i = 0; i < count; ++i) {
    const EtTrtKernelImage& image = images[i];
    et_trt::kernels::KernelImageView view;
    view.kernel = or_empty(image.kernel);
    view.arch = or_empty(image.arch);
    view.format = image.format == 1 ? et_trt::kernels::ImageFormat::kPtx : et_trt::kernels::ImageFormat::kCubin;
    view.image = image.image;
    view.image_size = image.image_size;
    view.entry = or_empty(image.entry);
    view.dtype = or_empty(image.dtype);
    view.num_warps = image.num_warps;
    view.shared_bytes = image.shared_bytes;
    view.global_scratch_bytes = image.global_scratch_bytes;
    view.global_scratch_align = image.global_scratch_align;
    view.profile_scratch_bytes = image.profile_scratch_bytes;
    view.block_m = image.block_m;
    view.block_n = image.block_n;
    view.block_k = image.block_k;
    view.persistent = image.persistent != 0;
    view.ptx_version = or_empty(image.ptx_version);
    views.push_back(std::move(view));
  }
  std::string message;
  std::unique_ptr<GroupedMMLauncher> launcher = GroupedMMLauncher::create(views, &message);
  if (!launcher) {
    copy_error(message, error, error_size);
    return nullptr;
  }
  return launcher.release();
}

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch(void* launcher, const void* a, const void* b, const int32_t* offs,
                                            void* out, int64_t rows, int64_t k, int64_t n, int64_t groups,
                                            int32_t trans_b, void* stream, char* error, size_t error_size) {
  if (launcher == nullptr) {
    copy_error("grouped_mm: null launcher", error, error_size);
    return 1;
  }
  std::string message;
  bool ok = static_cast<GroupedMMLauncher*>(launcher)->launch(a, b, offs, out, rows, k, n, groups, trans_b != 0,
                                                              static_cast<CUstream>(stream), &message);
  if (!ok) copy_error(message, error, error_size);
  return ok ? 0 : 1;
}

extern "C" ET_TRT_EXPORT const char* et_trt_grouped_mm_last_kernel(void* launcher) {
  return launcher ? static_cast<GroupedMMLauncher*>(launcher)->last_kernel().c_str() : "";
}

extern "C" ET_TRT_EXPORT void et_trt_grouped_mm_destroy(void* launcher) { delete static_cast<GroupedMMLauncher*>(launcher); }
