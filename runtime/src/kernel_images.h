// The grouped-GEMM kernel images of a blob, as the launcher takes them, and
// the compact form the GroupedMM plugin serializes into an engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grouped_mm_launcher.h"
#include "schema_generated.h"

namespace et_trt {

// The images of one dtype ("bf16"/"fp16") and layout (kernel names end in
// "_nk" for trans_b, "_kn" otherwise). They borrow the bytes of `blob`.
std::vector<kernels::KernelImageView> kernel_image_views(const blob::Blob& blob, const std::string& dtype,
                                                         bool trans_b);

// A standalone flatbuffer (schema.fbs, root Blob holding only `kernels`)
// with every image of `blob`: what the plugin carries in its fields.
std::vector<uint8_t> pack_kernel_images(const blob::Blob& blob);

// A pack read back after the flatbuffers Verifier; nullptr and *error if it
// is malformed. `data` must be 8-byte aligned and outlive the result.
const blob::Blob* unpack_kernel_images(const uint8_t* data, size_t size, std::string* error);

}  // namespace et_trt
