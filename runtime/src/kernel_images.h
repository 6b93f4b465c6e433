// The grouped-GEMM kernel images of a blob, as the launcher takes them, and
// the process-wide registry the GroupedMM plugin resolves its reference in.
//
// An engine does not carry the images: each GroupedMM plugin serializes only
// `kernel_images_id`, the sha256 of the concatenated image bytes of the blob's
// `kernels` in blob order (schema.fbs, table Engine). The bytes are named data
// (table KernelImage.image), fetched at init with the rest (named_data.h).
// Whoever deserializes or builds an engine registers the blob's images first
// (register_kernel_images), and the plugin finds them by that id.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grouped_mm_launcher.h"
#include "named_data.h"
#include "schema_generated.h"

namespace et_trt {

using KernelImagesId = std::array<uint8_t, 32>;

// sha256 of the concatenated bytes of `images`, in order.
KernelImagesId kernel_images_id(const std::vector<NamedBytes>& images);
std::string to_hex(const KernelImagesId& id);

// An owned copy of a blob's kernel images, immutable and shared by the engine
// that registered it and every plugin resolving to it.
class KernelPack {
 public:
  // `images`: the bytes of blob.kernels(), in order (PartitionData::kernel_images).
  KernelPack(const blob::Blob& blob, const std::vector<NamedBytes>& images);
  const KernelImagesId& id() const { return id_; }
  // The images of one dtype, layout (trans_b) and weight format; they borrow this pack's fields and
  // bytes. Float8RowScaled selects the fp8 GEMMs with the "quantize_rows" images of `dtype`, which
  // their launcher needs.
  std::vector<kernels::KernelImageRef> images(blob::DType dtype, bool trans_b,
                                              blob::WeightFormat weight_format = blob::WeightFormat::Dense) const;

 private:
  KernelImagesId id_;
  std::vector<std::unique_ptr<blob::KernelImageT>> fields_;  // blob.kernels(), unpacked
  std::vector<std::vector<uint8_t>> bytes_;                   // their bytes, in the same order
};

// Registers `blob`'s kernel images (a copy of `images`, their bytes) and returns
// them; an equal set registered before is shared. Entries live while someone
// holds them.
std::shared_ptr<const KernelPack> register_kernel_images(const blob::Blob& blob,
                                                         const std::vector<NamedBytes>& images);

// The registered images with this id, or nullptr.
std::shared_ptr<const KernelPack> find_kernel_images(const KernelImagesId& id);

}  // namespace et_trt
