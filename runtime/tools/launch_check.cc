// C entry points for the device check of the GroupedMM plugin's launch path
// without TensorRT (launch_check.py): a blob written by our export is read
// and verified by the runtime's blob reader, its kernel images are
// copied into the registry the plugin takes them from, and launched through
// the kernel launcher. Blobs of FP8 experts (weight format Float8RowScaled) are
// launched as the plugin does: with b_scale and a workspace (kernels::Fp8Operands).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check_blob.h"
#include "grouped_mm_launcher.h"
#include "kernel_images.h"

namespace {

struct LaunchCheck {
  std::shared_ptr<const et_trt::KernelPack> images;
  std::unique_ptr<et_trt::kernels::GroupedMMLauncher> launcher;
};

using et_trt::tools::copy_error;

}  // namespace

extern "C" {

// `blob_bytes` and its named data as `count` (key, bytes, size) entries; the images of `dtype`, trans_b and
// weight format (fp8 != 0: Float8RowScaled).
__attribute__((visibility("default"))) void* et_trt_launch_check_create(const uint8_t* blob_bytes, size_t size,
                                                                         const char* const* keys,
                                                                         const uint8_t* const* data,
                                                                         const size_t* sizes, size_t count,
                                                                         const char* dtype, int32_t trans_b,
                                                                         int32_t fp8, char* error, size_t error_size) {
  auto check = std::make_unique<LaunchCheck>();
  check->images = et_trt::tools::register_blob_images(blob_bytes, size, keys, data, sizes, count, error, error_size);
  if (check->images == nullptr) return nullptr;
  std::string message;
  const std::string name = dtype != nullptr ? dtype : "";
  const auto dtype_code = name == "bf16" ? et_trt::blob::DType::BFloat16 : et_trt::blob::DType::Float16;
  const auto format = fp8 ? et_trt::blob::WeightFormat::Float8RowScaled : et_trt::blob::WeightFormat::Dense;
  const auto images = name == "bf16" || name == "fp16" ? check->images->images(dtype_code, trans_b != 0, format)
                                                       : std::vector<et_trt::kernels::KernelImageRef>{};
  if (images.empty()) {
    copy_error("the blob has no " + name + (trans_b ? " nk" : " kn") + (fp8 ? " fp8" : "") +
                   " kernel images (bf16 or fp16)",
               error, error_size);
    return nullptr;
  }
  check->launcher = et_trt::kernels::GroupedMMLauncher::create(images, &message);
  if (check->launcher == nullptr) {
    copy_error(message, error, error_size);
    return nullptr;
  }
  return check.release();
}

// b_scale null: dense weights; else fp8 weights with b_scale [G, N] and `workspace` of workspace_bytes.
__attribute__((visibility("default"))) int32_t et_trt_launch_check_launch(void* handle, const void* a, const void* b,
                                                                          const int32_t* offs, void* out, int64_t rows,
                                                                          int64_t k, int64_t n, int64_t groups,
                                                                          int32_t trans_b, const float* b_scale,
                                                                          void* workspace, size_t workspace_bytes,
                                                                          void* stream, char* error,
                                                                          size_t error_size) {
  auto* check = static_cast<LaunchCheck*>(handle);
  std::string message;
  const et_trt::kernels::Fp8Operands fp8{b_scale, workspace, workspace_bytes};
  if (!check->launcher->launch(a, b, offs, out, rows, k, n, groups, trans_b != 0, static_cast<CUstream>(stream),
                               &message, b_scale != nullptr ? &fp8 : nullptr)) {
    copy_error(message, error, error_size);
    return 1;
  }
  return 0;
}

__attribute__((visibility("default"))) size_t et_trt_launch_check_fp8_workspace_bytes(int64_t rows, int64_t k) {
  return et_trt::kernels::GroupedMMLauncher::fp8_workspace_bytes(rows, k);
}

__attribute__((visibility("default"))) const char* et_trt_launch_check_last_kernel(void* handle) {
  return static_cast<LaunchCheck*>(handle)->launcher->last_kernel().c_str();
}

__attribute__((visibility("default"))) void et_trt_launch_check_destroy(void* handle) {
  delete static_cast<LaunchCheck*>(handle);
}

}  // extern "C"
