#include "kernel_images.h"

#include <openssl/evp.h>

#include <cstring>
#include <map>
#include <mutex>

namespace et_trt {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : ""; }

// Only the images: the plugin needs nothing else of the blob.
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

struct Registry {
  std::mutex mutex;
  std::map<KernelImagesId, std::weak_ptr<const KernelPack>> packs;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: plugins may be released during exit
  return *r;
}

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

KernelImagesId kernel_images_id(const blob::Blob& blob) {
  KernelImagesId id{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  if (blob.kernels() != nullptr) {
    for (const blob::KernelImage* k : *blob.kernels()) {
      if (k->image() != nullptr) EVP_DigestUpdate(ctx, k->image()->data(), k->image()->size());
    }
  }
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx, id.data(), &size);
  EVP_MD_CTX_free(ctx);
  return id;
}

std::string to_hex(const KernelImagesId& id) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : id) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

KernelPack::KernelPack(const blob::Blob& blob) : id_(kernel_images_id(blob)) {
  const std::vector<uint8_t> pack = pack_kernel_images(blob);
  storage_.resize(pack.size() / 8 + 1);
  std::memcpy(storage_.data(), pack.data(), pack.size());
}

std::shared_ptr<const KernelPack> register_kernel_images(const blob::Blob& blob) {
  const KernelImagesId id = kernel_images_id(blob);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (auto existing = r.packs[id].lock()) return existing;
  auto pack = std::make_shared<const KernelPack>(blob);
  r.packs[id] = pack;
  // Forget entries nobody holds any more.
  for (auto it = r.packs.begin(); it != r.packs.end();) it = it->second.expired() ? r.packs.erase(it) : ++it;
  return pack;
}

std::shared_ptr<const KernelPack> find_kernel_images(const KernelImagesId& id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.packs.find(id);
  return it == r.packs.end() ? nullptr : it->second.lock();
}

}  // namespace et_trt
