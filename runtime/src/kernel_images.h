// The grouped-GEMM kernel images of a blob, as the launcher takes them, and
// the process-wide registry the GroupedMM plugin resolves its reference in.
//
// An engine does not carry the images: each GroupedMM plugin serializes only
// `kernel_images_id`, the sha256 of the concatenated `image` bytes of the
// blob's `kernels` in blob order (schema.fbs, table Engine). Whoever
// deserializes or builds an engine registers the blob's images first
// (register_kernel_images), and the plugin finds them by that id.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grouped_mm_launcher.h"
#include "schema_generated.h"

namespace et_trt {

using KernelImagesId = std::array<uint8_t, 32>;

// The images of one dtype ("bf16"/"fp16") and layout (kernel names end in
// "_nk" for trans_b, "_kn" otherwise). They borrow the bytes of `blob`.
std::vector<kernels::KernelImageView> kernel_image_views(const blob::Blob& blob, const std::string& dtype,
                                                         bool trans_b);

// sha256 of the concatenated image bytes of `blob`'s kernels, in order.
KernelImagesId kernel_images_id(const blob::Blob& blob);
std::string to_hex(const KernelImagesId& id);

// An owned copy of a blob's kernel images (a standalone schema.fbs flatbuffer
// whose root Blob holds only `kernels`, 8-byte aligned), immutable and shared
// by the engine that registered it and every plugin resolving to it.
class KernelPack {
 public:
  explicit KernelPack(const blob::Blob& blob);
  const KernelImagesId& id() const { return id_; }
  const blob::Blob& images() const { return *blob::GetBlob(storage_.data()); }

 private:
  KernelImagesId id_;
  std::vector<uint64_t> storage_;
};

// Registers `blob`'s kernel images (a copy) and returns them; an equal set
// registered before is shared. Entries live while someone holds them.
std::shared_ptr<const KernelPack> register_kernel_images(const blob::Blob& blob);

// The registered images with this id, or nullptr.
std::shared_ptr<const KernelPack> find_kernel_images(const KernelImagesId& id);

}  // namespace et_trt
