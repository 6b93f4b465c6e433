// The engine provider's libraries, loaded with dlopen at the first init so
// the delegate loads where they are absent: TensorRT (libnvinfer.so.<major>,
// libnvonnxparser.so.<major>) or TensorRT for RTX (libtensorrt_rtx.so.1,
// libtensorrt_onnxparser_rtx.so.1, from $ET_TRT_TENSORRT_RTX_DIR or the
// loader's path). Both export the same entry points and, for TensorRT for RTX
// 1.x, TensorRT 11.1's interfaces; what only TensorRT for RTX has is in
// rtx_runtime_cache.h.
#pragma once

#include <NvInfer.h>
#include <NvOnnxParser.h>

#include <memory>
#include <string>

#include "provider_choice.h"

namespace et_trt {

// Forwards TensorRT's messages to ExecuTorch's log (warnings and errors;
// info with ET_TRT_VERBOSE=1).
class TensorRTLogger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override;
};

class TensorRTLibrary {
 public:
  // The process-wide library of `provider`, loaded once; nullptr and *error
  // (which library is missing and how to get it) if it cannot be loaded.
  // TensorRT must be the major version these sources were compiled against
  // (NV_TENSORRT_MAJOR); TensorRT for RTX 1.x needs TensorRT 11 headers.
  static TensorRTLibrary* get(Provider provider, std::string* error);
  Provider provider() const { return provider_; }

  std::unique_ptr<nvinfer1::IRuntime> create_runtime();
  std::unique_ptr<nvinfer1::IBuilder> create_builder();
  std::unique_ptr<nvonnxparser::IParser> create_parser(nvinfer1::INetworkDefinition& network);
  nvinfer1::IPluginRegistry* plugin_registry();

  // Version of the loaded library, e.g. "10.13.0.35" (with the build number), "1.7.1.116".
  const std::string& version() const { return version_; }
  // Whether an engine recorded as built by `version` ("10.13.0" or
  // "10.13.0.35") was built by this library.
  bool same_version(const std::string& version) const {
    return version == version_ || version_.rfind(version + ".", 0) == 0;
  }
  TensorRTLogger& logger() { return logger_; }

 private:
  void* create_runtime_ = nullptr;
  void* create_builder_ = nullptr;
  void* plugin_registry_ = nullptr;
  void* create_parser_ = nullptr;
  Provider provider_ = Provider::kTensorRT;
  std::string version_;
  TensorRTLogger logger_;
};

}  // namespace et_trt
