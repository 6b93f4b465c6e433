#include "tensorrt_library.h"

#include <dlfcn.h>
#include <executorch/runtime/platform/log.h>

#include "log.h"

#include <cstdlib>
#include <mutex>

namespace et_trt {
namespace {

using CreateFn = void* (*)(void*, int32_t);
using ParserFn = void* (*)(void*, void*, int);
using RegistryFn = nvinfer1::IPluginRegistry* (*)();
using VersionFn = int32_t (*)();

const std::string kMajor = std::to_string(NV_TENSORRT_MAJOR);

void* open_library(const std::string& name, std::string* error) {
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = "TensorRT is not installed here: cannot load " + name + " (" + (why ? why : "?") +
             "). Install TensorRT " + kMajor + ".x (libnvinfer and libnvonnxparser) or add its lib directory to "
             "LD_LIBRARY_PATH";
  }
  return lib;
}

}  // namespace

void TensorRTLogger::log(Severity severity, const char* message) noexcept {
  static const bool verbose = std::getenv("ET_TRT_VERBOSE") != nullptr;
  switch (severity) {
    case Severity::kINTERNAL_ERROR:
    case Severity::kERROR:
      log_error(std::string("TensorRT: ") + message);
      break;
    case Severity::kWARNING:
      ET_LOG(Info, "TensorRT warning: %s", message);
      break;
    default:
      if (verbose) ET_LOG(Info, "TensorRT: %s", message);
      break;
  }
}

TensorRTLibrary* TensorRTLibrary::get(std::string* error) {
  static TensorRTLibrary library;
  static std::string load_error;
  static std::once_flag once;
  // Loaded once and never closed: engines and plugins may live until exit.
  std::call_once(once, [] {
    void* nvinfer = open_library("libnvinfer.so." + kMajor, &load_error);
    if (nvinfer == nullptr) return;
    void* parser = open_library("libnvonnxparser.so." + kMajor, &load_error);
    if (parser == nullptr) return;
    library.create_runtime_ = dlsym(nvinfer, "createInferRuntime_INTERNAL");
    library.create_builder_ = dlsym(nvinfer, "createInferBuilder_INTERNAL");
    library.plugin_registry_ = dlsym(nvinfer, "getPluginRegistry");
    library.create_parser_ = dlsym(parser, "createNvOnnxParser_INTERNAL");
    auto major = reinterpret_cast<VersionFn>(dlsym(nvinfer, "getInferLibMajorVersion"));
    auto minor = reinterpret_cast<VersionFn>(dlsym(nvinfer, "getInferLibMinorVersion"));
    auto patch = reinterpret_cast<VersionFn>(dlsym(nvinfer, "getInferLibPatchVersion"));
    if (!library.create_runtime_ || !library.create_builder_ || !library.plugin_registry_ ||
        !library.create_parser_ || !major || !minor || !patch) {
      load_error = "the TensorRT libraries found lack entry points this runtime needs (built against TensorRT " +
                   std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + ")";
      return;
    }
    if (major() != NV_TENSORRT_MAJOR) {
      load_error = "libnvinfer is TensorRT " + std::to_string(major()) + ", this runtime was built for TensorRT " +
                   kMajor + ".x: rebuild runtime/ against that version's headers";
      return;
    }
    library.version_ = std::to_string(major()) + "." + std::to_string(minor()) + "." + std::to_string(patch());
    // The build number too, as Python's tensorrt.__version__ has it ("10.13.0.35").
    if (auto build = reinterpret_cast<VersionFn>(dlsym(nvinfer, "getInferLibBuildVersion"))) {
      library.version_ += "." + std::to_string(build());
    }
  });
  if (!load_error.empty()) {
    *error = load_error;
    return nullptr;
  }
  return &library;
}

std::unique_ptr<nvinfer1::IRuntime> TensorRTLibrary::create_runtime() {
  return std::unique_ptr<nvinfer1::IRuntime>(static_cast<nvinfer1::IRuntime*>(
      reinterpret_cast<CreateFn>(create_runtime_)(&logger_, NV_TENSORRT_VERSION)));
}

std::unique_ptr<nvinfer1::IBuilder> TensorRTLibrary::create_builder() {
  return std::unique_ptr<nvinfer1::IBuilder>(static_cast<nvinfer1::IBuilder*>(
      reinterpret_cast<CreateFn>(create_builder_)(&logger_, NV_TENSORRT_VERSION)));
}

std::unique_ptr<nvonnxparser::IParser> TensorRTLibrary::create_parser(nvinfer1::INetworkDefinition& network) {
  return std::unique_ptr<nvonnxparser::IParser>(static_cast<nvonnxparser::IParser*>(
      reinterpret_cast<ParserFn>(create_parser_)(&network, &logger_, NV_ONNX_PARSER_VERSION)));
}

nvinfer1::IPluginRegistry* TensorRTLibrary::plugin_registry() {
  return reinterpret_cast<RegistryFn>(plugin_registry_)();
}

}  // namespace et_trt
