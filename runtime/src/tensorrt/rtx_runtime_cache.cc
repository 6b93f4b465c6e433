#include "rtx_runtime_cache.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine_cache.h"

namespace et_trt::rtx {

#if NV_TENSORRT_MAJOR >= 11

// Mirrors of TensorRT for RTX's classes (see the header). Every apiv class
// begins with getPImpl after VRoot's destructor, as TensorRT's own do.
class VRuntimeCache;

struct RuntimeCacheFile::Cache : public nvinfer1::INoCopy {  // nvinfer1::IRuntimeCache
  virtual ~Cache() noexcept = default;
  VRuntimeCache* mImpl;
};

class VRuntimeCache : public nvinfer1::apiv::VRoot {
 public:
  virtual RuntimeCacheFile::Cache* getPImpl() noexcept = 0;
  virtual nvinfer1::IHostMemory* serialize() const noexcept = 0;
  virtual bool deserialize(const void* blob, size_t size) noexcept = 0;
  virtual bool reset() noexcept = 0;
};

class VRuntimeConfig : public nvinfer1::apiv::VRoot {
 public:
  // TensorRT 11.1's apiv::VRuntimeConfig ...
  virtual nvinfer1::IRuntimeConfig* getPImpl() noexcept = 0;
  virtual void setExecutionContextAllocationStrategy(nvinfer1::ExecutionContextAllocationStrategy) noexcept = 0;
  virtual nvinfer1::ExecutionContextAllocationStrategy getExecutionContextAllocationStrategy() const noexcept = 0;
  // ... then TensorRT for RTX's.
  virtual RuntimeCacheFile::Cache* createRuntimeCache() const noexcept = 0;
  virtual bool setRuntimeCache(const RuntimeCacheFile::Cache& cache) noexcept = 0;
};

namespace {

// IRuntimeConfig's implementation pointer (a protected member), read through a
// pointer to member, which is legal where the member itself is not accessible.
struct ConfigImpl : nvinfer1::IRuntimeConfig {
  static VRuntimeConfig* of(nvinfer1::IRuntimeConfig& config) {
    return reinterpret_cast<VRuntimeConfig*>(config.*(&ConfigImpl::mImpl));
  }
};

}  // namespace

std::unique_ptr<RuntimeCacheFile> RuntimeCacheFile::attach(nvinfer1::IRuntimeConfig& config, const std::string& dir,
                                                           const std::string& key, std::string* note) {
  const char* enabled = std::getenv("ET_TRT_RTX_RUNTIME_CACHE");
  if (enabled != nullptr && std::strcmp(enabled, "0") == 0) {
    *note = "runtime cache off (ET_TRT_RTX_RUNTIME_CACHE=0)";
    return nullptr;
  }
  if (dir.empty()) {
    *note = "no engine cache directory, so no runtime cache: kernels are compiled at every init";
    return nullptr;
  }
  VRuntimeConfig* impl = ConfigImpl::of(config);
  Cache* cache = impl->createRuntimeCache();
  if (cache == nullptr) {
    *note = "TensorRT for RTX could not create a runtime cache";
    return nullptr;
  }
  std::vector<uint8_t> bytes;
  if (read_cached_engine(dir, key, &bytes) && !cache->mImpl->deserialize(bytes.data(), bytes.size())) {
    *note = "the runtime cache " + dir + "/" + key + " was not accepted; starting an empty one";
    cache->mImpl->reset();
  }
  if (!impl->setRuntimeCache(*cache)) {
    *note = "TensorRT for RTX refused the runtime cache";
    delete cache;
    return nullptr;
  }
  return std::unique_ptr<RuntimeCacheFile>(new RuntimeCacheFile(cache, dir, key));
}

RuntimeCacheFile::RuntimeCacheFile(Cache* cache, std::string dir, std::string key)
    : cache_(cache), dir_(std::move(dir)), key_(std::move(key)) {}

RuntimeCacheFile::~RuntimeCacheFile() { delete cache_; }

bool RuntimeCacheFile::save(std::string* error) const {
  std::unique_ptr<nvinfer1::IHostMemory> bytes(cache_->mImpl->serialize());
  if (bytes == nullptr) {
    *error = "TensorRT for RTX could not serialize the runtime cache";
    return false;
  }
  return write_cached_engine(dir_, key_, bytes->data(), bytes->size(), error);
}

#endif  // NV_TENSORRT_MAJOR >= 11

}  // namespace et_trt::rtx
