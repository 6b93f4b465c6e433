#include "grouped_mm_capi.h"

#include <algorithm>
#include <cstring>
#include <memory>
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

// The `count` kernel images of `kernels`, a flatbuffer of the blob schema; false and *error if it is not one
// or holds another count.
bool unpack(const uint8_t* kernels, size_t kernels_size, int32_t count,
            std::vector<std::unique_ptr<et_trt::blob::KernelImageT>>* unpacked, std::string* error) {
  flatbuffers::Verifier verifier(kernels, kernels_size);
  if (kernels == nullptr || !et_trt::blob::VerifyBlobBuffer(verifier)) {
    *error = "the kernel images are not a flatbuffer of the blob schema (root Blob, identifier ETRT)";
    return false;
  }
  const auto* fields = et_trt::blob::GetBlob(kernels)->kernels();
  const int32_t kernel_count = fields ? static_cast<int32_t>(fields->size()) : 0;
  if (count != kernel_count) {
    *error = std::to_string(count) + " image byte strings for " + std::to_string(kernel_count) + " kernel images";
    return false;
  }
  for (int32_t i = 0; i < count; ++i) unpacked->emplace_back(fields->Get(static_cast<flatbuffers::uoffset_t>(i))->UnPack());
  return true;
}

}  // namespace

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_images_for_gpu(const uint8_t* kernels, size_t kernels_size,
                                                                  int32_t cc, uint8_t* chosen, int32_t count,
                                                                  char* error, size_t error_size) {
  std::vector<std::unique_ptr<et_trt::blob::KernelImageT>> unpacked;
  std::string message;
  if (!unpack(kernels, kernels_size, count, &unpacked, &message)) {
    copy_error("grouped_mm: " + message, error, error_size);
    return 1;
  }
  std::vector<et_trt::kernels::KernelImageRef> refs;
  for (const auto& image : unpacked) refs.push_back({image.get(), nullptr, 0});
  std::fill(chosen, chosen + count, 0);
  for (const et_trt::kernels::KernelImageRef* ref : et_trt::kernels::images_for_gpu(refs, cc)) {
    chosen[ref - refs.data()] = 1;
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
  std::vector<std::unique_ptr<et_trt::blob::KernelImageT>> unpacked;
  std::string message;
  if (!unpack(kernels, kernels_size, count, &unpacked, &message)) return refuse(message);
  if (count > 0 && (images == nullptr || image_sizes == nullptr)) return refuse("no image bytes were given");
  std::vector<et_trt::kernels::KernelImageRef> refs;
  for (int32_t i = 0; i < count; ++i) {
    const et_trt::blob::KernelImageT& image = *unpacked[i];
    if (image.image == nullptr || image.image->size != image_sizes[i])
      return refuse("kernel image " + std::to_string(i) + " (" + image.kernel + ") has " +
                    std::to_string(image_sizes[i]) + " bytes; its record says " +
                    (image.image ? std::to_string(image.image->size) : std::string("none")));
    refs.push_back({&image, images[i], image_sizes[i]});
  }
  std::unique_ptr<GroupedMMLauncher> launcher = GroupedMMLauncher::create(refs, &message);
  if (!launcher) {
    copy_error(message, error, error_size);
    return nullptr;
  }
  return launcher.release();
}

namespace {

int32_t launch(void* launcher, const void* a, const void* b, const int32_t* offs, void* out, int64_t rows, int64_t k,
               int64_t n, int64_t groups, int32_t trans_b, void* stream, const et_trt::kernels::Fp8Operands* fp8,
               char* error, size_t error_size) {
  if (launcher == nullptr) {
    copy_error("grouped_mm: null launcher", error, error_size);
    return 1;
  }
  std::string message;
  bool ok = static_cast<GroupedMMLauncher*>(launcher)->launch(a, b, offs, out, rows, k, n, groups, trans_b != 0,
                                                              static_cast<CUstream>(stream), &message, fp8);
  if (!ok) copy_error(message, error, error_size);
  return ok ? 0 : 1;
}

}  // namespace

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch(void* launcher, const void* a, const void* b, const int32_t* offs,
                                            void* out, int64_t rows, int64_t k, int64_t n, int64_t groups,
                                            int32_t trans_b, void* stream, char* error, size_t error_size) {
  return launch(launcher, a, b, offs, out, rows, k, n, groups, trans_b, stream, nullptr, error, error_size);
}

extern "C" ET_TRT_EXPORT int32_t et_trt_grouped_mm_launch_fp8(void* launcher, const void* a, const void* b,
                                                              const int32_t* offs, void* out, int64_t rows, int64_t k,
                                                              int64_t n, int64_t groups, int32_t trans_b,
                                                              const float* b_scale, void* workspace,
                                                              size_t workspace_bytes, int32_t swiglu, void* stream,
                                                              char* error, size_t error_size) {
  const et_trt::kernels::Fp8Operands fp8{b_scale, workspace, workspace_bytes, swiglu != 0};
  return launch(launcher, a, b, offs, out, rows, k, n, groups, trans_b, stream, &fp8, error, error_size);
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
