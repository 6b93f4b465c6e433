#include "kernel_images.h"

#include <openssl/evp.h>

#include <map>
#include <mutex>

namespace et_trt {
namespace {

std::string str(const flatbuffers::String* s) { return s ? s->str() : ""; }

std::string dtype_of(const blob::KernelImage& k) {
  return k.dtype() == blob::DType::BFloat16 ? "bf16" : k.dtype() == blob::DType::Float16 ? "fp16" : "";
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

KernelImagesId kernel_images_id(const std::vector<NamedBytes>& images) {
  KernelImagesId id{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const NamedBytes& image : images) EVP_DigestUpdate(ctx, image.data, image.size);
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

KernelPack::KernelPack(const blob::Blob& blob, const std::vector<NamedBytes>& images)
    : id_(kernel_images_id(images)) {
  const auto* kernels = blob.kernels();
  for (flatbuffers::uoffset_t i = 0; kernels != nullptr && i < kernels->size() && i < images.size(); ++i) {
    const auto* bytes = static_cast<const uint8_t*>(images[i].data);
    bytes_.emplace_back(bytes, bytes + images[i].size);
  }
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const blob::KernelImage* k = kernels->Get(static_cast<flatbuffers::uoffset_t>(i));
    kernels::KernelImageView v;
    v.kernel = str(k->kernel());
    v.arch = str(k->arch());
    v.format = k->format() == blob::ImageFormat::Ptx ? kernels::ImageFormat::kPtx : kernels::ImageFormat::kCubin;
    v.image = bytes_[i].data();
    v.image_size = bytes_[i].size();
    v.entry = str(k->entry());
    v.dtype = dtype_of(*k);
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
    images_.push_back(std::move(v));
    trans_b_.push_back(k->trans_b());
  }
}

std::vector<kernels::KernelImageView> KernelPack::views(const std::string& dtype, bool trans_b) const {
  std::vector<kernels::KernelImageView> selected;
  for (size_t i = 0; i < images_.size(); ++i) {
    if (images_[i].dtype == dtype && trans_b_[i] == trans_b) selected.push_back(images_[i]);
  }
  return selected;
}

std::shared_ptr<const KernelPack> register_kernel_images(const blob::Blob& blob,
                                                         const std::vector<NamedBytes>& images) {
  const KernelImagesId id = kernel_images_id(images);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (auto existing = r.packs[id].lock()) return existing;
  auto pack = std::make_shared<const KernelPack>(blob, images);
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
