// TensorRT for RTX's runtime cache: the kernels it compiles on the GPU when an
// execution context is made (its JIT step), kept on disk beside the engine
// cache so the next init skips the compile.
//
// The one API here that TensorRT does not have. TensorRT for RTX ships no C++
// headers, so its three classes are mirrored in rtx_runtime_cache.cc, in the
// declaration order of NVIDIA's TensorRT for RTX API reference
// (nvinfer1::IRuntimeConfig: TensorRT 11.1's members, then createRuntimeCache,
// setRuntimeCache, getRuntimeCache; nvinfer1::IRuntimeCache: serialize,
// deserialize, reset). Compiled against TensorRT 11 headers only (the
// interfaces TensorRT for RTX 1.x keeps). Not yet run on an RTX-class GPU (none
// is reachable from this project): ET_TRT_RTX_RUNTIME_CACHE=0 turns it off.
#pragma once

#include <NvInfer.h>

#include <memory>
#include <string>

namespace et_trt::rtx {

#if NV_TENSORRT_MAJOR >= 11

class RuntimeCacheFile {
 public:
  // A runtime cache set on `config`, filled from <dir>/<key> when that file
  // exists and is accepted; nullptr (and *note saying why) when caching is off
  // or TensorRT for RTX refuses it.
  static std::unique_ptr<RuntimeCacheFile> attach(nvinfer1::IRuntimeConfig& config, const std::string& dir,
                                                  const std::string& key, std::string* note);
  ~RuntimeCacheFile();
  RuntimeCacheFile(const RuntimeCacheFile&) = delete;
  RuntimeCacheFile& operator=(const RuntimeCacheFile&) = delete;

  // Writes the cache back to <dir>/<key> (atomically).
  bool save(std::string* error) const;

  struct Cache;  // TensorRT for RTX's nvinfer1::IRuntimeCache (mirrored in the .cc)

 private:
  RuntimeCacheFile(Cache* cache, std::string dir, std::string key);
  Cache* cache_;
  std::string dir_, key_;
};

#endif  // NV_TENSORRT_MAJOR >= 11

}  // namespace et_trt::rtx
