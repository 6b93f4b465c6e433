// create_engine with TensorRT: the embedded engine if it fits, else one from
// the engine cache, else one built from the blob's ONNX (then cached); and
// execution with input/output binding and staging.
#include <executorch/runtime/platform/log.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "cuda_driver.h"
#include "engine.h"
#include "engine_cache.h"
#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "provider_choice.h"
#include "rtx_runtime_cache.h"
#include "tensorrt_library.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;
using nvinfer1::Dims;

bool to_trt_dtype(blob::DType dtype, DataType* out) {
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

Dims to_dims(const std::vector<int64_t>& shape) {
  Dims dims{};
  dims.nbDims = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) dims.d[i] = shape[i];
  return dims;
}

Dims profile_dims(const IoSpec& spec, int which) {
  Dims dims{};
  dims.nbDims = static_cast<int32_t>(spec.dims.size());
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    const DimRange& d = spec.dims[i];
    dims.d[i] = which == 0 ? d.min : which == 1 ? d.opt : d.max;
  }
  return dims;
}

EngineError failure(EngineError::Kind kind, std::string message) { return EngineError{kind, std::move(message)}; }

// Logs the builder's phases, so a build of several minutes shows progress.
class BuildProgress final : public nvinfer1::IProgressMonitor {
 public:
  explicit BuildProgress(std::string part) : part_(std::move(part)) {}
  void phaseStart(const char* phase, const char* parent, int32_t steps) noexcept override {
    if (parent == nullptr) ET_LOG(Info, "et-trt: building '%s': %s (%d steps)", part_.c_str(), phase, steps);
  }
  bool stepComplete(const char*, int32_t) noexcept override { return true; }
  void phaseFinish(const char* phase) noexcept override {
    ET_LOG(Info, "et-trt: building '%s': %s done", part_.c_str(), phase);
  }

 private:
  std::string part_;
};

// A device buffer that only grows; reused across executions.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t capacity = 0;
};

class TensorRTEngine final : public Engine {
 public:
  // `images`: the blob's kernel images, registered for as long as the engine
  // lives, so its GroupedMM plugins resolve their kernel_images_id.
  TensorRTEngine(const CudaDriver& cuda, CUdevice device, CUcontext context, PartitionIo io,
                 std::shared_ptr<const KernelPack> images)
      : cuda_(cuda), device_(device), context_(context), io_(std::move(io)), images_(std::move(images)) {}

  ~TensorRTEngine() override {
    {
      ScopedContext scope(cuda_, context_);
#if NV_TENSORRT_MAJOR >= 11
      if (runtime_cache_ != nullptr) {
        std::string error;
        if (!runtime_cache_->save(&error)) ET_LOG(Info, "et-trt: runtime cache not saved: %s", error.c_str());
      }
#endif
      execution_.reset();
#if NV_TENSORRT_MAJOR >= 11
      runtime_config_.reset();
      runtime_cache_.reset();
#endif
      engine_.reset();
      runtime_.reset();
      for (auto* buffers : {&input_staging_, &output_staging_}) {
        for (DeviceBuffer& b : *buffers) {
          if (b.ptr) cuda_.cuMemFree(b.ptr);
        }
      }
      if (stream_) cuda_.cuStreamDestroy(stream_);
    }
    cuda_.cuDevicePrimaryCtxRelease(device_);
  }

  // Deserializes `plan` and prepares execution; false (with *error) if this
  // TensorRT cannot read it or it does not match the IO specs.
  // `cache_dir`/`cache_key`: where TensorRT for RTX keeps the runtime cache of this engine.
  bool load(TensorRTLibrary& trt, const void* plan, size_t size, const std::string& cache_dir,
            const std::string& cache_key, std::string* error) {
    ScopedContext scope(cuda_, context_);
    // A failed earlier attempt (embedded or cached plan) may have left these.
    execution_.reset();
    engine_.reset();
    runtime_ = trt.create_runtime();
    if (runtime_ == nullptr) {
      *error = "TensorRT could not create a runtime";
      return false;
    }
    engine_.reset(runtime_->deserializeCudaEngine(plan, size));
    if (engine_ == nullptr) {
      const std::string plugin_error = take_grouped_mm_error();
      *error = plugin_error.empty() ? "TensorRT could not deserialize the engine (see TensorRT's message above)"
                                    : "TensorRT could not deserialize the engine: " + plugin_error;
      return false;
    }
    for (const auto* specs : {&io_.inputs, &io_.outputs}) {
      const bool input = specs == &io_.inputs;
      for (const IoSpec& spec : *specs) {
        const char* name = spec.name.c_str();
        const auto mode = engine_->getTensorIOMode(name);
        DataType expected;
        if (mode != (input ? nvinfer1::TensorIOMode::kINPUT : nvinfer1::TensorIOMode::kOUTPUT)) {
          *error = "the engine has no " + std::string(input ? "input" : "output") + " tensor '" + spec.name + "'";
          return false;
        }
        if (!to_trt_dtype(spec.dtype, &expected) || engine_->getTensorDataType(name) != expected) {
          *error = "the engine's tensor '" + spec.name + "' is not " + dtype_name(spec.dtype);
          return false;
        }
      }
    }
#if NV_TENSORRT_MAJOR >= 11
    if (trt.provider() == Provider::kTensorRTRTX) {
      // TensorRT for RTX compiles the engine's kernels for this GPU here, with
      // the runtime cache of earlier inits.
      runtime_cache_.reset();
      runtime_config_.reset(engine_->createRuntimeConfig());
      if (runtime_config_ == nullptr) {
        *error = "TensorRT for RTX could not create a runtime configuration";
        return false;
      }
      std::string note;
      runtime_cache_ = rtx::RuntimeCacheFile::attach(*runtime_config_, cache_dir, runtime_cache_key(cache_key), &note);
      if (runtime_cache_ == nullptr) ET_LOG(Info, "et-trt: %s", note.c_str());
      execution_.reset(engine_->createExecutionContext(runtime_config_.get()));
    } else {
      execution_.reset(engine_->createExecutionContext());
    }
#else
    (void)cache_dir;
    (void)cache_key;
    execution_.reset(engine_->createExecutionContext());
#endif
    if (execution_ == nullptr) {
      *error = "TensorRT could not create an execution context (out of device memory?)";
      return false;
    }
    const CUresult r = stream_ ? CUDA_SUCCESS : cuda_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
      *error = cuda_.describe("cuStreamCreate", r);
      return false;
    }
    input_staging_.resize(io_.inputs.size());
    output_staging_.resize(io_.outputs.size());
    return true;
  }

  // One execution at a time per handle: the execution context, stream and
  // staging buffers are shared state.
  bool execute(const std::vector<InputTensor>& inputs, OutputBuffers& outputs, std::string* error) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ScopedContext scope(cuda_, context_);
    if (!scope.ok()) {
      *error = "cannot make the engine's CUDA context current";
      return false;
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const char* name = io_.inputs[i].name.c_str();
      if (!execution_->setInputShape(name, to_dims(inputs[i].shape))) {
        *error = "TensorRT refused shape " + shape_string(inputs[i].shape) + " for input '" + io_.inputs[i].name + "'";
        return false;
      }
      void* device = nullptr;
      if (!to_device(const_cast<void*>(inputs[i].data), inputs[i].nbytes, &input_staging_[i], true, &device, error)) {
        return false;
      }
      if (!execution_->setTensorAddress(name, device)) {
        *error = "TensorRT refused the address of input '" + io_.inputs[i].name + "'";
        return false;
      }
    }
    std::vector<void*> host_outputs(io_.outputs.size(), nullptr);
    std::vector<size_t> output_bytes(io_.outputs.size(), 0);
    for (size_t i = 0; i < io_.outputs.size(); ++i) {
      const char* name = io_.outputs[i].name.c_str();
      const Dims dims = execution_->getTensorShape(name);
      std::vector<int64_t> shape(dims.d, dims.d + std::max<int32_t>(dims.nbDims, 0));
      size_t bytes = dtype_size(io_.outputs[i].dtype);
      for (int64_t d : shape) {
        if (d < 0) {
          *error = "output '" + io_.outputs[i].name + "' has a data-dependent shape, which et-trt does not support";
          return false;
        }
        bytes *= size_t(d);
      }
      void* data = nullptr;
      size_t capacity = 0;
      if (!outputs.resize(i, shape, &data, &capacity, error)) return false;
      if (capacity < bytes) {
        *error = "output '" + io_.outputs[i].name + "' needs " + std::to_string(bytes) + " bytes, its buffer has " +
                 std::to_string(capacity);
        return false;
      }
      void* device = nullptr;
      if (!to_device(data, bytes, &output_staging_[i], false, &device, error)) return false;
      if (device != data) host_outputs[i] = data;
      output_bytes[i] = bytes;
      if (!execution_->setTensorAddress(name, device)) {
        *error = "TensorRT refused the address of output '" + io_.outputs[i].name + "'";
        return false;
      }
    }
    if (!execution_->enqueueV3(reinterpret_cast<cudaStream_t>(stream_))) {
      *error = "TensorRT could not enqueue the engine (see TensorRT's message above)";
      return false;
    }
    for (size_t i = 0; i < host_outputs.size(); ++i) {
      if (host_outputs[i] == nullptr || output_bytes[i] == 0) continue;
      const CUresult r = cuda_.cuMemcpyDtoHAsync(host_outputs[i], output_staging_[i].ptr, output_bytes[i], stream_);
      if (r != CUDA_SUCCESS) {
        *error = cuda_.describe("cuMemcpyDtoHAsync", r);
        return false;
      }
    }
    const CUresult r = cuda_.cuStreamSynchronize(stream_);
    if (r != CUDA_SUCCESS) {
      *error = cuda_.describe("cuStreamSynchronize (running the engine)", r);
      return false;
    }
    return true;
  }

 private:
  // `data` as a device pointer: itself if it is device memory, else the
  // staging buffer (grown as needed; inputs are copied in).
  bool to_device(void* data, size_t bytes, DeviceBuffer* staging, bool copy_in, void** device, std::string* error) {
    unsigned int memory_type = 0;
    if (data != nullptr &&
        cuda_.cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CUdeviceptr(data)) ==
            CUDA_SUCCESS &&
        memory_type == CU_MEMORYTYPE_DEVICE) {
      *device = data;
      return true;
    }
    // TensorRT wants a non-null address even for empty tensors.
    const size_t needed = std::max<size_t>(bytes, 256);
    if (staging->capacity < needed) {
      if (staging->ptr) cuda_.cuMemFree(staging->ptr);
      staging->ptr = 0;
      staging->capacity = 0;
      const CUresult r = cuda_.cuMemAlloc(&staging->ptr, needed);
      if (r != CUDA_SUCCESS) {
        *error = cuda_.describe("cuMemAlloc (staging buffer)", r);
        return false;
      }
      staging->capacity = needed;
    }
    if (copy_in && bytes > 0) {
      const CUresult r = cuda_.cuMemcpyHtoDAsync(staging->ptr, data, bytes, stream_);
      if (r != CUDA_SUCCESS) {
        *error = cuda_.describe("cuMemcpyHtoDAsync", r);
        return false;
      }
    }
    *device = reinterpret_cast<void*>(staging->ptr);
    return true;
  }

  const CudaDriver& cuda_;
  CUdevice device_;
  CUcontext context_;
  PartitionIo io_;
  std::shared_ptr<const KernelPack> images_;
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
#if NV_TENSORRT_MAJOR >= 11
  std::unique_ptr<nvinfer1::IRuntimeConfig> runtime_config_;       // TensorRT for RTX
  std::unique_ptr<rtx::RuntimeCacheFile> runtime_cache_;           // TensorRT for RTX, may be null
#endif
  std::unique_ptr<nvinfer1::IExecutionContext> execution_;
  CUstream stream_ = nullptr;
  std::vector<DeviceBuffer> input_staging_, output_staging_;
  std::mutex mutex_;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// TensorRT 10.13 and later parse an ONNX whose initializers the caller hands
// over from memory (IParser::loadInitializer).
#define ET_TRT_PARSER_LOADS_INITIALIZERS (NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 13))

// Parses the blob's ONNX, its external initializers (the weights, schema.fbs
// table Weight) taken from the fetched named data: from memory where the
// parser can, else (TensorRT 10.3 on JetPack 6) as ONNX external-data files
// written to a temporary folder for the parse, the one copy the older parser
// needs.
bool parse_onnx(nvonnxparser::IParser& parser, const blob::Blob& root, const PartitionData& data, std::string* error) {
  const auto* onnx = root.onnx();
  if (data.weights.empty()) return parser.parse(onnx->data(), onnx->size());
#if ET_TRT_PARSER_LOADS_INITIALIZERS
  (void)error;
  if (!parser.loadModelProto(onnx->data(), onnx->size())) return false;
  for (const auto& [name, bytes] : data.weights) {
    if (!parser.loadInitializer(name.c_str(), bytes.data, bytes.size)) return false;
  }
  return parser.parseModelProto();
#else
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TMPDIR");
  std::string folder = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/et_trt_onnx_XXXXXX";
  if (mkdtemp(folder.data()) == nullptr) {
    *error = "cannot create a temporary folder for the ONNX's external data: " + std::string(std::strerror(errno));
    return false;
  }
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } cleanup{folder};
  const auto* weights = root.weights();
  for (flatbuffers::uoffset_t i = 0; i < weights->size(); ++i) {
    const fs::path file = fs::path(folder) / weights->Get(i)->data()->key()->str();  // the ONNX location
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    std::ofstream out(file, std::ios::binary);
    const NamedBytes& bytes = data.weights[i].second;
    if (ec || !out.write(static_cast<const char*>(bytes.data), static_cast<std::streamsize>(bytes.size))) {
      *error = "cannot write the ONNX's external data to " + file.string() + " (disk full?)";
      return false;
    }
  }
  const std::string model = folder + "/model.onnx";
  return parser.parse(onnx->data(), onnx->size(), model.c_str());
#endif
}

// Builds a serialized engine from the blob's ONNX and weights with its
// BuildOptions, one optimization profile from the IO specs' ranges and the
// timing cache at `timing_cache_path` (empty: none).
bool build_plan(TensorRTLibrary& trt, const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                const std::string& timing_cache_path, std::vector<uint8_t>* plan, std::string* error) {
  const blob::Blob& root = *blob.root;
  const std::string part = root.part() ? root.part()->str() : "";
  auto builder = trt.create_builder();
  if (builder == nullptr) {
    *error = "TensorRT could not create a builder";
    return false;
  }
  // Strongly typed on every TensorRT: the lowering wrote the recipe's precision
  // into the ONNX's tensor types (lowering/precision.py), float32 islands
  // included, and TensorRT 11 networks are strongly typed only. TensorRT 10
  // must be asked: weakly typed (its default), with the kFP16/kBF16 flags set
  // before, the builder could run layers in other types than the ONNX's. No
  // precision flag is set; kTF32 still governs the float32 layers.
#if NV_TENSORRT_MAJOR < 11
  const nvinfer1::NetworkDefinitionCreationFlags flags =
      1U << static_cast<uint32_t>(nvinfer1::NetworkDefinitionCreationFlag::kSTRONGLY_TYPED);
#else
  const nvinfer1::NetworkDefinitionCreationFlags flags = 0;
#endif
  std::unique_ptr<nvinfer1::INetworkDefinition> network(builder->createNetworkV2(flags));
  if (network == nullptr) {
    *error = "TensorRT could not create a network";
    return false;
  }
  auto parser = trt.create_parser(*network);
  if (parser == nullptr) {
    *error = "TensorRT could not create its ONNX parser";
    return false;
  }
  {
    KernelImagesForParsing images(register_kernel_images(root, data.kernel_images));
    std::string parse_error;
    if (!parse_onnx(*parser, root, data, &parse_error)) {
      *error = parse_error.empty() ? "TensorRT's ONNX parser refused the partition:" : parse_error;
      for (int i = 0; i < parser->getNbErrors(); ++i) *error += std::string(" [") + parser->getError(i)->desc() + "]";
      return false;
    }
  }

  std::unique_ptr<nvinfer1::IBuilderConfig> config(builder->createBuilderConfig());
  const blob::BuildOptions& options = *root.build_options();
  if (options.workspace_bytes() > 0) {
    config->setMemoryPoolLimit(nvinfer1::MemoryPoolType::kWORKSPACE, options.workspace_bytes());
  }
  config->setBuilderOptimizationLevel(options.optimization_level());
  if (options.tf32()) {
    config->setFlag(nvinfer1::BuilderFlag::kTF32);
  } else {
    config->clearFlag(nvinfer1::BuilderFlag::kTF32);
  }
  nvinfer1::IOptimizationProfile* profile = builder->createOptimizationProfile();
  for (int32_t i = 0; i < network->getNbInputs(); ++i) {
    const char* name = network->getInput(i)->getName();
    const IoSpec* spec = nullptr;
    for (const IoSpec& s : io.inputs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      *error = std::string("the ONNX input '") + name + "' is not among the blob's inputs";
      return false;
    }
    for (int which = 0; which < 3; ++which) {
      const auto selector = static_cast<nvinfer1::OptProfileSelector>(which);
      if (!profile->setDimensions(name, selector, profile_dims(*spec, which))) {
        *error = "TensorRT refused the optimization profile of input '" + spec->name + "' " + spec_string(*spec);
        return false;
      }
    }
  }
  config->addOptimizationProfile(profile);
  std::unique_ptr<nvinfer1::ITimingCache> timing_cache;
  if (!timing_cache_path.empty()) {
    const std::vector<uint8_t> bytes = read_file(timing_cache_path);
    timing_cache.reset(config->createTimingCache(bytes.data(), bytes.size()));
    if (timing_cache) config->setTimingCache(*timing_cache, false);
  }
  BuildProgress progress(part);
  config->setProgressMonitor(&progress);

  ET_LOG(Info, "et-trt: building the %s %s engine of '%s' from its ONNX (%zu bytes); this can take minutes",
         provider_name(trt.provider()), trt.version().c_str(), part.c_str(), size_t(root.onnx()->size()));
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<nvinfer1::IHostMemory> serialized(builder->buildSerializedNetwork(*network, *config));
  if (serialized == nullptr) {
    *error = "TensorRT could not build the engine of '" + part + "' (TensorRT's errors are above)";
    return false;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ET_LOG(Info, "et-trt: built '%s' in %.1f s (%zu bytes)", part.c_str(), seconds, serialized->size());
  if (!timing_cache_path.empty() && config->getTimingCache() != nullptr) {
    std::unique_ptr<nvinfer1::IHostMemory> cache(config->getTimingCache()->serialize());
    if (cache) {
      std::ofstream(timing_cache_path, std::ios::binary)
          .write(static_cast<const char*>(cache->data()), static_cast<std::streamsize>(cache->size()));
    }
  }
  const auto* bytes = static_cast<const uint8_t*>(serialized->data());
  plan->assign(bytes, bytes + serialized->size());
  return true;
}

// TensorRT, the driver and the GPU this process runs on.
struct Machine {
  TensorRTLibrary* trt = nullptr;
  const CudaDriver* cuda = nullptr;
  CUdevice device = 0;
  std::string gpu_name;
  int capability = 0;
};

// Picks the provider for `blob` (provider_choice.h) among those installed,
// logs the choice and why, then opens CUDA and the device. `only_tensorrt`:
// TensorRT regardless of the blob and $ET_TRT_PROVIDER.
bool open_machine(const blob::Blob& blob, int ordinal, bool only_tensorrt, Machine* m, EngineError* error) {
  std::string message;
  const std::string part = blob.part() ? blob.part()->str() : "";
  ProviderPreference preference;
  if (!only_tensorrt && !parse_provider_preference(std::getenv("ET_TRT_PROVIDER"), &preference, &message)) {
    *error = failure(EngineError::Kind::kUnavailable, message);
    return false;
  }
  InstalledProviders installed;
  TensorRTLibrary* libraries[2] = {TensorRTLibrary::get(Provider::kTensorRT, &installed.tensorrt_missing),
                                   TensorRTLibrary::get(Provider::kTensorRTRTX, &installed.rtx_missing)};
  ProviderChoice choice;
  if (only_tensorrt) {
    choice.ok = installed.has(Provider::kTensorRT);
    choice.reason = choice.ok ? "export-time builds use TensorRT" : installed.tensorrt_missing;
  } else {
    choice = choose_provider(blob, preference, installed);
  }
  if (!choice.ok) {
    *error = failure(EngineError::Kind::kUnavailable, choice.reason);
    return false;
  }
  m->trt = libraries[choice.provider == Provider::kTensorRT ? 0 : 1];
  ET_LOG(Info, "et-trt: '%s' uses %s %s: %s", part.c_str(), provider_name(choice.provider), m->trt->version().c_str(),
         choice.reason.c_str());
  m->cuda = CudaDriver::get(&message);
  if (m->cuda == nullptr) {
    *error = failure(EngineError::Kind::kUnavailable,
                     std::string(provider_name(choice.provider)) + " is installed, but " + message);
    return false;
  }
  nvinfer1::IPluginRegistry* registry = m->trt->plugin_registry();
  set_grouped_mm_logger(&m->trt->logger());
  if (registry == nullptr || !register_grouped_mm_plugin(*registry, &message)) {
    *error = failure(EngineError::Kind::kFailed, registry ? message : "TensorRT has no plugin registry");
    return false;
  }
  const CUresult r = m->cuda->cuDeviceGet(&m->device, ordinal);
  if (r != CUDA_SUCCESS) {
    *error = failure(EngineError::Kind::kUnavailable,
                     "CUDA device " + std::to_string(ordinal) + ": " + m->cuda->describe("cuDeviceGet", r));
    return false;
  }
  char name[256] = {};
  int major = 0, minor = 0;
  m->cuda->cuDeviceGetName(name, sizeof(name) - 1, m->device);
  m->cuda->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, m->device);
  m->cuda->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, m->device);
  m->gpu_name = name;
  m->capability = major * 10 + minor;
  return true;
}

}  // namespace

bool build_engine_plan(const BlobView& blob, const PartitionIo& io, const PartitionData& data, int device,
                       const std::string& timing_cache_path, std::vector<uint8_t>* plan, EngineTarget* target,
                       EngineError* error) {
  // The C entry builds TensorRT engines (export records them as such);
  // TensorRT for RTX engines are built at export by its Python builder.
  Machine m;
  if (!open_machine(*blob.root, device, /*only_tensorrt=*/true, &m, error)) return false;
  if (blob.root->onnx() == nullptr || blob.root->onnx()->size() == 0) {
    *error = failure(EngineError::Kind::kIncompatible, "the blob has no ONNX to build an engine from");
    return false;
  }
  CUcontext context;
  const CUresult r = m.cuda->cuDevicePrimaryCtxRetain(&context, m.device);
  if (r != CUDA_SUCCESS) {
    *error = failure(EngineError::Kind::kFailed, m.cuda->describe("cuDevicePrimaryCtxRetain", r));
    return false;
  }
  std::string message;
  bool built;
  {
    ScopedContext scope(*m.cuda, context);
    built = build_plan(*m.trt, blob, io, data, timing_cache_path, plan, &message);
  }
  m.cuda->cuDevicePrimaryCtxRelease(m.device);
  if (!built) {
    *error = failure(EngineError::Kind::kFailed, message);
    return false;
  }
  *target = EngineTarget{m.trt->version(), m.gpu_name, m.capability};
  return true;
}

std::unique_ptr<Engine> create_engine(const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                                      const EngineOptions& options, EngineError* error) {
  const blob::Blob& root = *blob.root;
  const std::string part = root.part() ? root.part()->str() : "";
  std::string message;
  Machine m;
  if (!open_machine(root, options.device, /*only_tensorrt=*/false, &m, error)) return nullptr;
  TensorRTLibrary* trt = m.trt;
  const CudaDriver* cuda = m.cuda;
  const CUdevice device = m.device;
  const std::string& gpu_name = m.gpu_name;
  const int capability = m.capability;
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
        ET_LOG(Info, "et-trt: '%s' runs the engine embedded at export", part.c_str());
        return engine;
      }
      ET_LOG(Info, "et-trt: '%s': the embedded engine does not load (%s); building from the ONNX", part.c_str(),
             message.c_str());
    } else {
      ET_LOG(Info, "et-trt: '%s': the embedded engine is for %s (sm%d) with %s%s; this is %s (sm%d) with %s%s: "
                   "not using it",
             part.c_str(), built_for.empty() ? "any GPU" : built_for.c_str(), embedded->compute_capability(),
             provider_text.c_str(), embedded->tensorrt_version()->str().c_str(), gpu_name.c_str(), capability,
             provider_text.c_str(), trt->version().c_str());
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
      ET_LOG(Info, "et-trt: '%s' runs the cached engine %s/%s", part.c_str(), options.cache_dir.c_str(), key.c_str());
      return engine;
    }
    ET_LOG(Info, "et-trt: cached engine %s/%s does not load (%s); rebuilding", options.cache_dir.c_str(),
           key.c_str(), message.c_str());
  }

  // 3. Build from the ONNX, then cache. No timing cache: the blob's names a
  // path on the export machine (engines built here are cached whole).
  {
    ScopedContext scope(*cuda, context);
    if (!build_plan(*trt, blob, io, data, "", &plan, &message)) {
      *error = failure(EngineError::Kind::kFailed, message);
      return nullptr;
    }
  }
  if (options.cache_dir.empty()) {
    ET_LOG(Info, "et-trt: no engine cache directory (set ET_TRT_ENGINE_CACHE): '%s' will be rebuilt next time",
           part.c_str());
  } else if (!write_cached_engine(options.cache_dir, key, plan.data(), plan.size(), &message)) {
    ET_LOG(Info, "et-trt: cannot cache the engine of '%s': %s", part.c_str(), message.c_str());
  } else {
    ET_LOG(Info, "et-trt: cached the engine of '%s' as %s/%s", part.c_str(), options.cache_dir.c_str(), key.c_str());
  }
  if (!engine->load(*trt, plan.data(), plan.size(), options.cache_dir, key, &message)) {
    *error = failure(EngineError::Kind::kFailed, "the engine just built does not load: " + message);
    return nullptr;
  }
  return engine;
}

}  // namespace et_trt
