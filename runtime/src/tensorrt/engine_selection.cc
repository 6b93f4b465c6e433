// Engine selection (engine.h with TensorRT): picks the provider, then the
// embedded engine if it fits this GPU, else one from the engine cache, else one
// built from the blob's ONNX (tensorrt_builder.cc, then cached), loaded into a
// TensorRTEngine (tensorrt_executor.cc).

#include <cstdlib>
#include <memory>

#include "cuda_driver.h"
#include "engine.h"
#include "engine_cache.h"
#include "gpu_device.h"
#include "kernel_images.h"
#include "log.h"
#include "provider_choice.h"
#include "tensorrt_builder.h"
#include "tensorrt_executor.h"
#include "tensorrt_library.h"

namespace et_trt {
namespace {

EngineError failure(EngineError::Kind kind, std::string message) { return EngineError{kind, std::move(message)}; }

// The messages of TensorRT, of the GroupedMM plugin and of the builder, to ExecuTorch's log: TensorRT's info
// only with ET_TRT_VERBOSE=1.
void executorch_log(LogLevel level, const char* message) {
  static const bool verbose = std::getenv("ET_TRT_VERBOSE") != nullptr;
  switch (level) {
    case LogLevel::kError:
      log_error(std::string("TensorRT: ") + message);
      break;
    case LogLevel::kWarning:
      log_info(std::string("TensorRT warning: ") + message);
      break;
    case LogLevel::kInfo:
      log_info(message);
      break;
    case LogLevel::kVerbose:
      if (verbose) log_info(std::string("TensorRT: ") + message);
      break;
  }
}

// TensorRT, the driver and the GPU this process runs on.
struct Machine {
  TensorRTLibrary* trt = nullptr;
  GpuDevice gpu;
};

// Picks the provider for `blob` (provider_choice.h) among those installed,
// logs the choice and why, then opens CUDA and the device.
bool open_machine(const blob::Blob& blob, int ordinal, Machine* m, EngineError* error) {
  TensorRTLogger::set_sink(&executorch_log);
  std::string message;
  const std::string part = blob.part() ? blob.part()->str() : "";
  ProviderPreference preference;
  if (!parse_provider_preference(std::getenv("ET_TRT_PROVIDER"), &preference, &message)) {
    *error = failure(EngineError::Kind::kUnavailable, message);
    return false;
  }
  InstalledProviders installed;
  TensorRTLibrary* libraries[2] = {TensorRTLibrary::get(Provider::kTensorRT, &installed.tensorrt_missing),
                                   TensorRTLibrary::get(Provider::kTensorRTRTX, &installed.rtx_missing)};
  const ProviderChoice choice = choose_provider(blob, preference, installed);
  if (!choice.ok) {
    *error = failure(EngineError::Kind::kUnavailable, choice.reason);
    return false;
  }
  m->trt = libraries[choice.provider == Provider::kTensorRT ? 0 : 1];
  log_info("et-trt: '" + part + "' uses " + provider_name(choice.provider) + " " + m->trt->version() + ": " +
           choice.reason);
  if (!open_gpu_device(ordinal, &m->gpu, &message)) {
    *error = failure(EngineError::Kind::kUnavailable,
                     std::string(provider_name(choice.provider)) + " is installed, but " + message);
    return false;
  }
  // For the engines deserialized here; a build registers them too.
  if (!m->trt->use_plugins(&message)) {
    *error = failure(EngineError::Kind::kFailed, message);
    return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Engine> create_engine(const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                                      const EngineOptions& options, EngineError* error) {
  const blob::Blob& root = *blob.root;
  const std::string part = root.part() ? root.part()->str() : "";
  std::string message;
  Machine m;
  if (!open_machine(root, options.device, &m, error)) return nullptr;
  TensorRTLibrary* trt = m.trt;
  const CudaDriver* cuda = m.gpu.cuda;
  const CUdevice device = m.gpu.device;
  const std::string& gpu_name = m.gpu.name;
  const int capability = m.gpu.capability;
  CUcontext context;
  const CUresult r = cuda->cuDevicePrimaryCtxRetain(&context, device);
  if (r != CUDA_SUCCESS) {
    *error = failure(EngineError::Kind::kFailed, cuda->describe("cuDevicePrimaryCtxRetain", r));
    return nullptr;
  }
  // From here the engine owns the context reference (released in its destructor).
  auto engine = std::make_unique<TensorRTEngine>(*cuda, device, context, io,
                                                 register_kernel_images(root, data.kernel_images));

  const Provider provider = trt->provider();
  const std::string provider_text = std::string(provider_name(provider)) + " ";
  // Engines and runtime caches built here are cached under this key.
  const std::string key = engine_cache_key(blob.content_id_hex(), gpu_name, capability, provider, trt->version());

  // 1. An engine embedded at export, if one was built by this provider and
  // version for this GPU (TensorRT: this GPU model; TensorRT for RTX, built
  // ahead of time: this compute capability).
  const auto* embedded_engines = root.engines();
  const blob::Provider wanted = provider == Provider::kTensorRT ? blob::Provider::TensorRT : blob::Provider::TensorRTRTX;
  for (flatbuffers::uoffset_t i = 0; embedded_engines != nullptr && i < embedded_engines->size(); ++i) {
    const blob::Engine* embedded = embedded_engines->Get(i);
    if (embedded->provider() != wanted) continue;
    const std::string built_for = embedded->gpu_name() ? embedded->gpu_name()->str() : "";
    const bool gpu_fits = built_for == gpu_name || (provider == Provider::kTensorRTRTX && built_for.empty());
    if (trt->same_version(embedded->tensorrt_version()->str()) && gpu_fits &&
        embedded->compute_capability() == capability) {
      const NamedBytes& embedded_plan = data.engine_plans[i];
      if (engine->load(*trt, embedded_plan.data, embedded_plan.size, options.cache_dir, key, &message)) {
        log_info("et-trt: '" + part + "' runs the engine embedded at export");
        return engine;
      }
      log_info("et-trt: '" + part + "': the embedded engine does not load (" + message + "); building from the ONNX");
    } else {
      log_info("et-trt: '" + part + "': the embedded engine is for " + (built_for.empty() ? "any GPU" : built_for) +
               " (sm" + std::to_string(embedded->compute_capability()) + ") with " + provider_text +
               embedded->tensorrt_version()->str() + "; this is " + gpu_name + " (sm" + std::to_string(capability) +
               ") with " + provider_text + trt->version() + ": not using it");
    }
  }
  if (root.onnx() == nullptr || root.onnx()->size() == 0) {
    *error = failure(EngineError::Kind::kIncompatible,
                     "part '" + part + "' has no ONNX to build an engine for " + gpu_name + " with " + provider_text +
                         trt->version() + ", and its embedded engine does not fit: re-export for this machine");
    return nullptr;
  }

  // 2. An engine built here before.
  std::vector<uint8_t> plan;
  if (read_cached_engine(options.cache_dir, key, &plan)) {
    if (engine->load(*trt, plan.data(), plan.size(), options.cache_dir, key, &message)) {
      log_info("et-trt: '" + part + "' runs the cached engine " + options.cache_dir + "/" + key);
      return engine;
    }
    log_info("et-trt: cached engine " + options.cache_dir + "/" + key + " does not load (" + message + "); rebuilding");
  }

  // 3. Build from the ONNX, then cache. No timing cache: the blob's names a
  // path on the export machine (engines built here are cached whole).
  {
    ScopedContext scope(*cuda, context);
    std::vector<std::string> not_applied;
    BuildFailure build_failure;
    if (!build_plan(*trt, blob, io, data, BuildRequest{}, &plan, &not_applied, &build_failure)) {
      *error = failure(EngineError::Kind::kFailed, describe(build_failure));
      return nullptr;
    }
  }
  if (options.cache_dir.empty()) {
    log_info("et-trt: no engine cache directory (set ET_TRT_ENGINE_CACHE): '" + part + "' will be rebuilt next time");
  } else if (!write_cached_engine(options.cache_dir, key, plan.data(), plan.size(), &message)) {
    log_info("et-trt: cannot cache the engine of '" + part + "': " + message);
  } else {
    log_info("et-trt: cached the engine of '" + part + "' as " + options.cache_dir + "/" + key);
  }
  if (!engine->load(*trt, plan.data(), plan.size(), options.cache_dir, key, &message)) {
    *error = failure(EngineError::Kind::kFailed, "the engine just built does not load: " + message);
    return nullptr;
  }
  return engine;
}

}  // namespace et_trt
