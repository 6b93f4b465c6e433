#include "tensorrt_library.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "grouped_mm_plugin.h"
#include "moe_experts_plugin.h"

namespace et_trt {
namespace {

using CreateFn = void* (*)(void*, int32_t);
using ParserFn = void* (*)(void*, void*, int);
using RegistryFn = nvinfer1::IPluginRegistry* (*)();
using VersionFn = int32_t (*)();

const std::string kMajor = std::to_string(NV_TENSORRT_MAJOR);
// TensorRT for RTX 1.x keeps TensorRT 11.1's interfaces (FACTS.md); older headers do not match it.
constexpr bool kRtxCompatibleHeaders = NV_TENSORRT_MAJOR >= 11;

std::string install_hint(Provider provider) {
  return provider == Provider::kTensorRT
             ? "Install TensorRT " + kMajor + ".x (libnvinfer and libnvonnxparser) or add its lib directory to "
                   "LD_LIBRARY_PATH"
             : std::string("Install TensorRT for RTX (pip install 'et-trt[tensorrt-rtx]', or NVIDIA's SDK) and set "
                           "ET_TRT_TENSORRT_RTX_DIR to the folder of libtensorrt_rtx.so.1 (et_trt_backend.runtime."
                           "load() does for the pip wheel) or add it to LD_LIBRARY_PATH");
}

void* open_library(Provider provider, const std::string& name, std::string* error) {
  std::string path = name;
  const char* rtx_dir = std::getenv("ET_TRT_TENSORRT_RTX_DIR");
  if (provider == Provider::kTensorRTRTX && rtx_dir != nullptr && rtx_dir[0] != '\0') path = std::string(rtx_dir) + "/" + name;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    *error = std::string(provider_name(provider)) + " is not installed here: cannot load " + path + " (" +
             (why ? why : "?") + "). " + install_hint(provider);
  }
  return lib;
}

void stderr_sink(LogLevel level, const char* message) {
  if (level != LogLevel::kVerbose) std::fprintf(stderr, "%s\n", message);
}

std::atomic<LogSink> sink{&stderr_sink};
thread_local std::vector<std::string>* captured = nullptr;

// The parser of TensorRT for RTX opens its library by the unversioned name
// libtensorrt_rtx.so when it adds a plugin layer, through its own folder or
// the loader's path; the pip wheels ship only libtensorrt_rtx.so.1, and the
// process then aborts. Why that would happen with `parser` loaded, or "".
std::string rtx_unversioned_library_missing(void* parser) {
  constexpr char kUnversioned[] = "libtensorrt_rtx.so";
  char origin[4096] = "the folder of libtensorrt_rtx.so.1";
  if (dlinfo(parser, RTLD_DI_ORIGIN, origin) == 0) {
    std::error_code ignored;
    if (std::filesystem::exists(std::string(origin) + "/" + kUnversioned, ignored)) return "";
  }
  if (dlopen(kUnversioned, RTLD_NOW | RTLD_LOCAL) != nullptr) return "";  // kept open, as the parser would
  return std::string("TensorRT for RTX lacks ") + kUnversioned + " beside libtensorrt_onnxparser_rtx.so.1 (a bug of "
         "its wheels: its ONNX parser opens that name when it adds a plugin layer, and the process aborts); create "
         "it with `ln -s libtensorrt_rtx.so.1 " + origin + "/" + kUnversioned + "` (scripts/setup.sh does)";
}

}  // namespace

bool to_trt_dtype(blob::DType dtype, nvinfer1::DataType* out) {
  using nvinfer1::DataType;
  switch (dtype) {
    case blob::DType::Float32: *out = DataType::kFLOAT; return true;
    case blob::DType::Float16: *out = DataType::kHALF; return true;
    case blob::DType::BFloat16: *out = DataType::kBF16; return true;
    case blob::DType::Int8: *out = DataType::kINT8; return true;
    case blob::DType::Int32: *out = DataType::kINT32; return true;
    case blob::DType::Int64: *out = DataType::kINT64; return true;
    case blob::DType::Bool: *out = DataType::kBOOL; return true;
    case blob::DType::UInt8: *out = DataType::kUINT8; return true;
    default: return false;
  }
}

void TensorRTLogger::log(Severity severity, const char* message) noexcept {
  const bool error = severity == Severity::kINTERNAL_ERROR || severity == Severity::kERROR;
  if (error && captured != nullptr) captured->emplace_back(message);
  sink.load()(error ? LogLevel::kError : severity == Severity::kWARNING ? LogLevel::kWarning : LogLevel::kVerbose,
              message);
}

void TensorRTLogger::note(const std::string& message) { sink.load()(LogLevel::kInfo, message.c_str()); }

void TensorRTLogger::set_sink(LogSink new_sink) { sink.store(new_sink != nullptr ? new_sink : &stderr_sink); }

TensorRTLogger::Capture::Capture(std::vector<std::string>* errors) : outer_(captured) { captured = errors; }

TensorRTLogger::Capture::~Capture() { captured = outer_; }

TensorRTLibrary* TensorRTLibrary::get(Provider provider, std::string* error) {
  static TensorRTLibrary libraries[2];
  static std::string load_errors[2];
  static std::once_flag once[2];
  const int index = provider == Provider::kTensorRT ? 0 : 1;
  TensorRTLibrary& library = libraries[index];
  std::string& load_error = load_errors[index];
  // Loaded once and never closed: engines and plugins may live until exit.
  std::call_once(once[index], [&] {
    library.provider_ = provider;
    if (provider == Provider::kTensorRTRTX && !kRtxCompatibleHeaders) {
      load_error = "this et-trt library was built against TensorRT " + kMajor +
                   " headers; TensorRT for RTX needs one built against TensorRT 11 headers";
      return;
    }
    const bool rtx = provider == Provider::kTensorRTRTX;
    void* infer = open_library(provider, rtx ? "libtensorrt_rtx.so.1" : "libnvinfer.so." + kMajor, &load_error);
    if (infer == nullptr) return;
    void* parser =
        open_library(provider, rtx ? "libtensorrt_onnxparser_rtx.so.1" : "libnvonnxparser.so." + kMajor, &load_error);
    if (parser == nullptr) return;
    if (rtx) {
      load_error = rtx_unversioned_library_missing(parser);
      if (!load_error.empty()) return;
    }
    library.create_runtime_ = dlsym(infer, "createInferRuntime_INTERNAL");
    library.create_builder_ = dlsym(infer, "createInferBuilder_INTERNAL");
    library.plugin_registry_ = dlsym(infer, "getPluginRegistry");
    library.create_parser_ = dlsym(parser, "createNvOnnxParser_INTERNAL");
    auto major = reinterpret_cast<VersionFn>(dlsym(infer, "getInferLibMajorVersion"));
    auto minor = reinterpret_cast<VersionFn>(dlsym(infer, "getInferLibMinorVersion"));
    auto patch = reinterpret_cast<VersionFn>(dlsym(infer, "getInferLibPatchVersion"));
    if (!library.create_runtime_ || !library.create_builder_ || !library.plugin_registry_ ||
        !library.create_parser_ || !major || !minor || !patch) {
      load_error = std::string("the ") + provider_name(provider) +
                   " libraries found lack entry points this runtime needs (built against TensorRT " +
                   std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + " headers)";
      return;
    }
    const int expected_major = rtx ? 1 : NV_TENSORRT_MAJOR;
    if (major() != expected_major) {
      load_error = std::string("the ") + provider_name(provider) + " library found is version " +
                   std::to_string(major()) + ".x; this runtime supports " + std::to_string(expected_major) +
                   ".x: " + (rtx ? "install TensorRT for RTX 1.x" : "rebuild runtime/ against that version's headers");
      return;
    }
    library.version_ = std::to_string(major()) + "." + std::to_string(minor()) + "." + std::to_string(patch());
    // The build number too, as Python's tensorrt.__version__ has it ("10.13.0.35").
    if (auto build = reinterpret_cast<VersionFn>(dlsym(infer, "getInferLibBuildVersion"))) {
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

bool TensorRTLibrary::use_plugins(std::string* error) {
  nvinfer1::IPluginRegistry* registry = plugin_registry();
  if (registry == nullptr) {
    *error = std::string(provider_name(provider_)) + " has no plugin registry";
    return false;
  }
  set_grouped_mm_logger(&logger_);
  return register_grouped_mm_plugin(*registry, error) && register_moe_experts_plugin(*registry, error);
}

}  // namespace et_trt
