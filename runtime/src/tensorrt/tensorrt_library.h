// TensorRT's libraries (libnvinfer, libnvonnxparser), loaded with dlopen at
// the first init so the delegate loads where TensorRT is absent.
#pragma once

#include <NvInfer.h>
#include <NvOnnxParser.h>

#include <memory>
#include <string>

namespace et_trt {

// Forwards TensorRT's messages to ExecuTorch's log (warnings and errors;
// info with ET_TRT_VERBOSE=1).
class TensorRTLogger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override;
};

class TensorRTLibrary {
 public:
  // The process-wide library, loaded once; nullptr and *error (which library
  // is missing and how to get it) if it cannot be loaded. Needs the major
  // version these sources were compiled against (NV_TENSORRT_MAJOR).
  static TensorRTLibrary* get(std::string* error);

  std::unique_ptr<nvinfer1::IRuntime> create_runtime();
  std::unique_ptr<nvinfer1::IBuilder> create_builder();
  std::unique_ptr<nvonnxparser::IParser> create_parser(nvinfer1::INetworkDefinition& network);
  nvinfer1::IPluginRegistry* plugin_registry();

  // Version of the loaded libnvinfer, e.g. "10.13.0.35" (with the build number).
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
  std::string version_;
  TensorRTLogger logger_;
};

}  // namespace et_trt
