// The GroupedMM plugin's copy of a blob's kernel images: selection by dtype
// and layout, the id its engines reference them by, and the registry.
#include <gtest/gtest.h>

#include "kernel_images.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

struct Kernels {
  std::vector<uint8_t> blob;
  std::vector<std::vector<uint8_t>> bytes;  // each image's named data, in blob order
  std::vector<NamedBytes> images() const {
    std::vector<NamedBytes> out;
    for (const auto& b : bytes) out.push_back({b.data(), b.size(), nullptr});
    return out;
  }
};

flatbuffers::Offset<blob::KernelImage> kernel(flatbuffers::FlatBufferBuilder& fbb, const char* variant, bool trans_b,
                                              const char* arch, blob::ImageFormat format, const char* entry,
                                              blob::DType dtype, int32_t shared, int32_t scratch, int32_t align,
                                              bool persistent, const char* ptx_version,
                                              blob::WeightFormat weight_format = blob::WeightFormat::Dense,
                                              bool waits_for_prior_grid = false, bool y_in_dtype = false) {
  const std::vector<uint8_t> sha256(32, 0);  // the registry reads the bytes it is given, not the record's digest
  auto image = blob::CreateNamedDataDirect(fbb, "et_trt/00", 4, &sha256);
  const std::string name = std::string("grouped_mm_") + variant + (trans_b ? "_nk" : "_kn");
  return blob::CreateKernelImageDirect(fbb, name.c_str(), variant, trans_b, arch, format, image, entry, dtype, 8,
                                       shared, scratch, align, 0, 128, 256, 64, persistent, ptx_version,
                                       weight_format, waits_for_prior_grid, y_in_dtype);
}

Kernels blob_with_kernels() {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels = {
      kernel(fbb, "tma", true, "sm_90a", blob::ImageFormat::Cubin, "k_tma", blob::DType::BFloat16, 196608, 384, 128,
             true, "8.6"),
      kernel(fbb, "any", true, "sm_80", blob::ImageFormat::Ptx, "k_any", blob::DType::BFloat16, 0, 0, 1, false, "8.0"),
      kernel(fbb, "tma", false, "sm_90a", blob::ImageFormat::Cubin, "k_kn", blob::DType::BFloat16, 0, 0, 1, false,
             "8.6"),
      kernel(fbb, "tma", true, "sm_90a", blob::ImageFormat::Cubin, "k_fp16", blob::DType::Float16, 0, 0, 1, false,
             "8.6"),
      kernel(fbb, "wgmma", true, "sm_90a", blob::ImageFormat::Cubin, "k_fp8", blob::DType::BFloat16, 0, 0, 1, true,
             "", blob::WeightFormat::Float8RowScaled, true, true),
      kernel(fbb, "quantize_rows", true, "sm_90a", blob::ImageFormat::Cubin, "k_quantize", blob::DType::BFloat16, 0,
             0, 1, false, "8.6", blob::WeightFormat::Float8RowScaled)};
  fbb.Finish(blob::CreateBlobDirect(fbb, "velocity", 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, &kernels),
             blob::BlobIdentifier());
  return {std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()),
          {{1, 2, 3, 4}, {'.', 'v', 'e', 'r'}, {5, 6}, {7, 8, 9}, {10}, {11, 12}}};
}

TEST(KernelImages, SelectsByDtypeLayoutAndWeightFormat) {
  const Kernels k = blob_with_kernels();
  const KernelPack pack(*blob::GetBlob(k.blob.data()), k.images());
  const auto images = pack.images(blob::DType::BFloat16, true);
  ASSERT_EQ(images.size(), 2u);
  const blob::KernelImageT& tma = *images[0].fields;
  EXPECT_EQ(tma.entry, "k_tma");
  EXPECT_EQ(tma.kernel, "grouped_mm_tma_nk");
  EXPECT_EQ(tma.variant, "tma");
  EXPECT_TRUE(tma.trans_b);
  EXPECT_EQ(tma.format, blob::ImageFormat::Cubin);
  EXPECT_EQ(tma.shared_bytes, 196608);
  EXPECT_EQ(tma.global_scratch_bytes, 384);
  EXPECT_EQ(tma.global_scratch_align, 128);
  EXPECT_EQ(tma.block_n, 256);
  EXPECT_TRUE(tma.persistent);
  EXPECT_EQ(tma.dtype, blob::DType::BFloat16);
  EXPECT_EQ(std::vector<uint8_t>(images[0].bytes, images[0].bytes + images[0].size), k.bytes[0]);
  EXPECT_EQ(images[1].fields->format, blob::ImageFormat::Ptx);
  EXPECT_EQ(images[1].fields->ptx_version, "8.0");
  EXPECT_EQ(pack.images(blob::DType::BFloat16, false).size(), 1u);
  EXPECT_EQ(pack.images(blob::DType::Float16, true).at(0).fields->entry, "k_fp16");
  EXPECT_TRUE(pack.images(blob::DType::Float16, false).empty());
  // Dense is the default: the fp8 images (GEMM and row quantization) only by their weight format.
  EXPECT_EQ(pack.images(blob::DType::BFloat16, true, blob::WeightFormat::Dense).size(), 2u);
  const auto fp8 = pack.images(blob::DType::BFloat16, true, blob::WeightFormat::Float8RowScaled);
  ASSERT_EQ(fp8.size(), 2u);
  EXPECT_EQ(fp8[0].fields->entry, "k_fp8");
  EXPECT_EQ(fp8[1].fields->variant, "quantize_rows");
  EXPECT_EQ(fp8[1].fields->weight_format, blob::WeightFormat::Float8RowScaled);
  // waits_for_prior_grid (appended after weight_format, default false) reaches the launchers.
  EXPECT_TRUE(fp8[0].fields->waits_for_prior_grid);
  EXPECT_FALSE(fp8[1].fields->waits_for_prior_grid);
  // So does y_in_dtype (appended after it, default false).
  EXPECT_TRUE(fp8[0].fields->y_in_dtype);
  EXPECT_FALSE(fp8[1].fields->y_in_dtype);
  EXPECT_FALSE(tma.y_in_dtype);
  EXPECT_TRUE(pack.images(blob::DType::Float16, true, blob::WeightFormat::Float8RowScaled).empty());
}

// The id is the schema's contract: sha256 of the image bytes, concatenated in blob order.
TEST(KernelImages, IdIsTheSha256OfTheImagesInOrder) {
  const Kernels k = blob_with_kernels();
  std::vector<uint8_t> concatenated;
  for (const auto& b : k.bytes) concatenated.insert(concatenated.end(), b.begin(), b.end());
  EXPECT_EQ(to_hex(kernel_images_id(k.images())), testing::sha256_hex(concatenated));
  // Another order of the same images is another id.
  std::vector<NamedBytes> reordered = k.images();
  std::swap(reordered[0], reordered[1]);
  EXPECT_NE(kernel_images_id(reordered), kernel_images_id(k.images()));
}

TEST(KernelImages, RegistryResolvesByIdWhileHeld) {
  Kernels k = blob_with_kernels();
  const blob::Blob* root = blob::GetBlob(k.blob.data());
  auto images = register_kernel_images(*root, k.images());
  EXPECT_EQ(images->id(), kernel_images_id(k.images()));
  EXPECT_EQ(register_kernel_images(*root, k.images()), images);  // an equal set is shared
  auto found = find_kernel_images(images->id());
  ASSERT_EQ(found, images);
  // The registered pack holds a copy: the caller's bytes may go.
  const std::vector<std::vector<uint8_t>> original = k.bytes;
  for (auto& b : k.bytes) std::fill(b.begin(), b.end(), 0xff);
  const auto after = found->images(blob::DType::BFloat16, true);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(std::vector<uint8_t>(after[0].bytes, after[0].bytes + after[0].size), original[0]);
  EXPECT_EQ(std::vector<uint8_t>(after[1].bytes, after[1].bytes + after[1].size), original[1]);
  KernelImagesId unknown = images->id();
  unknown[0] ^= 1;
  EXPECT_EQ(find_kernel_images(unknown), nullptr);
  const KernelImagesId id = images->id();
  images.reset();
  found.reset();
  EXPECT_EQ(find_kernel_images(id), nullptr);  // nobody holds them any more
}

}  // namespace
}  // namespace et_trt
