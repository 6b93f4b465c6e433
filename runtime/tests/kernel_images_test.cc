// The GroupedMM plugin's view of a blob's kernel images: selection by dtype
// and layout, the id its engines reference them by, and the registry.
#include <gtest/gtest.h>

#include "kernel_images.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

std::vector<uint8_t> blob_with_kernels() {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels;
  const std::vector<uint8_t> cubin = {1, 2, 3, 4}, ptx = {'.', 'v', 'e', 'r'};
  kernels.push_back(blob::CreateKernelImageDirect(fbb, "grouped_mm_tma_nk", "sm_90a", blob::ImageFormat::Cubin, &cubin,
                                                  "k_tma", blob::DType::BFloat16, 8, 196608, 384, 128, 0, 128, 256,
                                                  64, true, "8.6"));
  kernels.push_back(blob::CreateKernelImageDirect(fbb, "grouped_mm_any_nk", "sm_80", blob::ImageFormat::Ptx, &ptx,
                                                  "k_any", blob::DType::BFloat16, 4, 0, 0, 1, 0, 64, 64, 32, false,
                                                  "8.0"));
  kernels.push_back(blob::CreateKernelImageDirect(fbb, "grouped_mm_tma_kn", "sm_90a", blob::ImageFormat::Cubin, &cubin,
                                                  "k_kn", blob::DType::BFloat16, 8, 0, 0, 1, 0, 128, 256, 64, false,
                                                  "8.6"));
  kernels.push_back(blob::CreateKernelImageDirect(fbb, "grouped_mm_tma_nk", "sm_90a", blob::ImageFormat::Cubin, &cubin,
                                                  "k_fp16", blob::DType::Float16, 8, 0, 0, 1, 0, 128, 256, 64, false,
                                                  "8.6"));
  fbb.Finish(blob::CreateBlobDirect(fbb, "velocity", 0, nullptr, nullptr, 0, nullptr, nullptr, &kernels),
             blob::BlobIdentifier());
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

TEST(KernelImages, SelectsByDtypeAndLayout) {
  const std::vector<uint8_t> bytes = blob_with_kernels();
  const blob::Blob* root = blob::GetBlob(bytes.data());
  const auto views = kernel_image_views(*root, "bf16", true);
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].entry, "k_tma");
  EXPECT_EQ(views[0].format, kernels::ImageFormat::kCubin);
  EXPECT_EQ(views[0].shared_bytes, 196608);
  EXPECT_EQ(views[0].global_scratch_bytes, 384);
  EXPECT_EQ(views[0].global_scratch_align, 128);
  EXPECT_EQ(views[0].block_n, 256);
  EXPECT_TRUE(views[0].persistent);
  EXPECT_EQ(views[0].dtype, "bf16");
  EXPECT_EQ(views[0].image_size, 4u);
  EXPECT_EQ(views[1].format, kernels::ImageFormat::kPtx);
  EXPECT_EQ(views[1].ptx_version, "8.0");
  EXPECT_EQ(kernel_image_views(*root, "bf16", false).size(), 1u);
  EXPECT_EQ(kernel_image_views(*root, "fp16", true).at(0).entry, "k_fp16");
  EXPECT_TRUE(kernel_image_views(*root, "fp16", false).empty());
}

// The id is the schema's contract: sha256 of the image bytes, concatenated in blob order.
TEST(KernelImages, IdIsTheSha256OfTheImagesInOrder) {
  const std::vector<uint8_t> bytes = blob_with_kernels();
  const blob::Blob* root = blob::GetBlob(bytes.data());
  std::vector<uint8_t> concatenated;
  for (const blob::KernelImage* k : *root->kernels()) {
    concatenated.insert(concatenated.end(), k->image()->begin(), k->image()->end());
  }
  EXPECT_EQ(to_hex(kernel_images_id(*root)), testing::sha256_hex(concatenated));
  // Another order of the same images is another id.
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels;
  const std::vector<uint8_t> ptx = {'.', 'v', 'e', 'r'}, cubin = {1, 2, 3, 4};
  for (const auto* image : {&ptx, &cubin}) {
    kernels.push_back(blob::CreateKernelImageDirect(fbb, "k_nk", "sm_80", blob::ImageFormat::Cubin, image));
  }
  fbb.Finish(blob::CreateBlobDirect(fbb, "p", 0, nullptr, nullptr, 0, nullptr, nullptr, &kernels));
  const blob::Blob* reordered = blob::GetBlob(fbb.GetBufferPointer());
  EXPECT_NE(kernel_images_id(*reordered), kernel_images_id(*root));
}

TEST(KernelImages, RegistryResolvesByIdWhileHeld) {
  const std::vector<uint8_t> bytes = blob_with_kernels();
  const blob::Blob* root = blob::GetBlob(bytes.data());
  auto images = register_kernel_images(*root);
  EXPECT_EQ(images->id(), kernel_images_id(*root));
  EXPECT_EQ(register_kernel_images(*root), images);  // an equal set is shared
  auto found = find_kernel_images(images->id());
  ASSERT_EQ(found, images);
  // The registered copy holds the same images, selected the same way.
  const auto before = kernel_image_views(*root, "bf16", true);
  const auto after = kernel_image_views(found->images(), "bf16", true);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].entry, before[i].entry);
    EXPECT_EQ(std::vector<uint8_t>(after[i].image, after[i].image + after[i].image_size),
              std::vector<uint8_t>(before[i].image, before[i].image + before[i].image_size));
    EXPECT_EQ(after[i].shared_bytes, before[i].shared_bytes);
  }
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
