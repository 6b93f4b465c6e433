#include "kernel_images.h"

namespace et_trt {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : ""; }

}  // namespace

std::vector<kernels::KernelImageView> kernel_image_views(const blob::Blob& blob, const std::string& dtype,
                                                         bool trans_b) {
  std::vector<kernels::KernelImageView> views;
  if (blob.kernels() == nullptr) return views;
  for (const blob::KernelImage* k : *blob.kernels()) {
    const std::string image_dtype = k->dtype() == blob::DType::BFloat16 ? "bf16"
                                    : k->dtype() == blob::DType::Float16 ? "fp16"
                                                                         : "";
    if (image_dtype != dtype || ends_with(str(k->kernel()), "_nk") != trans_b) continue;
    if (k->image() == nullptr) continue;
    kernels::KernelImageView v;
    v.kernel = str(k->kernel());
    v.arch = str(k->arch());
    v.format = k->format() == blob::ImageFormat::Ptx ? kernels::ImageFormat::kPtx : kernels::ImageFormat::kCubin;
    v.image = k->image()->data();
    v.image_size = k->image()->size();
    v.entry = str(k->entry());
    v.dtype = image_dtype;
    v.num_warps = k->num_warps();
    v.shared_bytes = k->shared_bytes();
    v.global_scratch_bytes = k->global_scratch_bytes();
    v.global_scratch_align = k->global_scratch_align();
    v.profile_scratch_bytes = k->profile_scratch_bytes();
    v.block_m = k->block_m();
    v.block_n = k->block_n();
    v.block_k = k->block_k();
    v.persistent = k->persistent();
    v.ptx_version = str(k->ptx_version());
    views.push_back(std::move(v));
  }
  return views;
}

std::vector<uint8_t> pack_kernel_images(const blob::Blob& blob) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::KernelImage>> images;
  if (blob.kernels() != nullptr) {
    for (const blob::KernelImage* k : *blob.kernels()) {
      const auto* image = k->image();
      images.push_back(blob::CreateKernelImage(
          fbb, fbb.CreateString(str(k->kernel())), fbb.CreateString(str(k->arch())), k->format(),
          image ? fbb.CreateVector(image->data(), image->size()) : 0, fbb.CreateString(str(k->entry())),
          k->dtype(), k->num_warps(), k->shared_bytes(), k->global_scratch_bytes(), k->global_scratch_align(),
          k->profile_scratch_bytes(), k->block_m(), k->block_n(), k->block_k(), k->persistent(),
          fbb.CreateString(str(k->ptx_version()))));
    }
  }
  auto kernels = fbb.CreateVector(images);
  blob::BlobBuilder root(fbb);
  root.add_kernels(kernels);
  fbb.Finish(root.Finish(), blob::BlobIdentifier());
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

const blob::Blob* unpack_kernel_images(const uint8_t* data, size_t size, std::string* error) {
  flatbuffers::Verifier verifier(data, size);
  if (!blob::VerifyBlobBuffer(verifier)) {
    *error = "the plugin's kernel images fail flatbuffers verification";
    return nullptr;
  }
  return blob::GetBlob(data);
}

}  // namespace et_trt
