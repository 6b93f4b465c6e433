#include "capi_images.h"

#include <algorithm>
#include <cstring>

namespace et_trt::kernels::capi {

void copy_error(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

bool read_records(const uint8_t* kernels, size_t kernels_size, int32_t count, Images* out, std::string* message) {
  flatbuffers::Verifier verifier(kernels, kernels_size);
  if (kernels == nullptr || !blob::VerifyBlobBuffer(verifier)) {
    *message = "the kernel images are not a flatbuffer of the blob schema (root Blob, identifier ETRT)";
    return false;
  }
  const auto* fields = blob::GetBlob(kernels)->kernels();
  const int32_t kernel_count = fields ? static_cast<int32_t>(fields->size()) : 0;
  if (count != kernel_count) {
    *message = std::to_string(count) + " image byte strings for " + std::to_string(kernel_count) + " kernel images";
    return false;
  }
  for (int32_t i = 0; i < count; ++i) {
    out->fields.emplace_back(fields->Get(static_cast<flatbuffers::uoffset_t>(i))->UnPack());
    out->refs.push_back({out->fields.back().get(), nullptr, 0});
  }
  return true;
}

bool read_images(const uint8_t* kernels, size_t kernels_size, const uint8_t* const* images, const size_t* image_sizes,
                 int32_t count, Images* out, std::string* message) {
  if (!read_records(kernels, kernels_size, count, out, message)) return false;
  if (count > 0 && (images == nullptr || image_sizes == nullptr)) {
    *message = "no image bytes were given";
    return false;
  }
  for (int32_t i = 0; i < count; ++i) {
    const blob::KernelImageT& image = *out->fields[i];
    if (image.image == nullptr || image.image->size != image_sizes[i]) {
      *message = "kernel image " + std::to_string(i) + " (" + image.kernel + ") has " + std::to_string(image_sizes[i]) +
                 " bytes; its record says " + (image.image ? std::to_string(image.image->size) : std::string("none"));
      return false;
    }
    out->refs[i].bytes = images[i];
    out->refs[i].size = image_sizes[i];
  }
  return true;
}

}  // namespace et_trt::kernels::capi
