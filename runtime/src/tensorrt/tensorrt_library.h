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
#include <vector>

#include "provider_choice.h"
#include "schema_generated.h"

namespace et_trt {

// How much a message matters, for whoever shows it.
enum class LogLevel {
  kError,    // TensorRT's errors and the GroupedMM plugin's refusals
  kWarning,  // TensorRT's warnings
  kInfo,     // et-trt's own progress (the builder's phases)
  kVerbose,  // TensorRT's info and verbose messages
};
// Where the messages go: ExecuTorch's log in the delegate, the caller's
// callback in et_trt_build_engine (libet_trt_plugin.so).
using LogSink = void (*)(LogLevel level, const char* message);

// The logger TensorRT, its ONNX parser and the GroupedMM plugin are handed:
// forwards every message to the process's sink (stderr until one is set) and
// lets a build collect the errors logged on its thread.
class TensorRTLogger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override;
  // et-trt's own progress message.
  void note(const std::string& message);
  static void set_sink(LogSink sink);

  // While alive, the errors logged on this thread are appended to `errors` too.
  class Capture {
   public:
    explicit Capture(std::vector<std::string>* errors);
    ~Capture();
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;

   private:
    std::vector<std::string>* outer_;
  };
};

// The TensorRT type an IO spec's dtype is bound as; false for a dtype no TensorRT tensor holds.
bool to_trt_dtype(blob::DType dtype, nvinfer1::DataType* out);

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
  // Registers the GroupedMM and MoEExperts plugins with this library's registry
  // (once) and points their messages at this library's logger; false and *error
  // if refused.
  bool use_plugins(std::string* error);

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
