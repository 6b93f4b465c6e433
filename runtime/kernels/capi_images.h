// What the C ABIs for Python (grouped_mm_capi.h, moe_experts_capi.h) share: the kernel images handed over
// as a flatbuffer of the blob schema plus their bytes, and error messages copied into the caller's buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image_loading.h"

// The C ABI is this library's interface: exported also where the build hides symbols by
// default (runtime/CMakeLists.txt does, and builds this library as its subdirectory).
#define ET_TRT_EXPORT __attribute__((visibility("default")))

namespace et_trt::kernels::capi {

void copy_error(const std::string& message, char* error, size_t error_size);

// The images as a launcher's create takes them; `refs` borrow `fields` and the caller's bytes.
struct Images {
  std::vector<std::unique_ptr<blob::KernelImageT>> fields;
  std::vector<KernelImageRef> refs;
};

// The records alone (refs without bytes): `kernels` as below, holding `count` images. false and *message
// when the buffer is not that or holds another count.
bool read_records(const uint8_t* kernels, size_t kernels_size, int32_t count, Images* out, std::string* message);

// `kernels`: a flatbuffer of the blob schema (root Blob, file identifier "ETRT", no et-trt blob header)
// whose `kernels` are the images; `images[i]` holds the `image_sizes[i]` bytes of kernels[i]. false and
// *message when the buffer is not that, or the counts or sizes disagree with its records.
bool read_images(const uint8_t* kernels, size_t kernels_size, const uint8_t* const* images, const size_t* image_sizes,
                 int32_t count, Images* out, std::string* message);

}  // namespace et_trt::kernels::capi
