#include "kernel_images.h"

#include <openssl/evp.h>

#include <map>
#include <mutex>

namespace et_trt {
namespace {

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
    fields_.emplace_back(kernels->Get(i)->UnPack());
    const auto* bytes = static_cast<const uint8_t*>(images[i].data);
    bytes_.emplace_back(bytes, bytes + images[i].size);
  }
}

std::vector<kernels::KernelImageRef> KernelPack::images(blob::DType dtype, bool trans_b,
                                                        blob::WeightFormat weight_format) const {
  std::vector<kernels::KernelImageRef> selected;
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i]->dtype == dtype && fields_[i]->trans_b == trans_b && fields_[i]->weight_format == weight_format)
      selected.push_back({fields_[i].get(), bytes_[i].data(), bytes_[i].size()});
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
