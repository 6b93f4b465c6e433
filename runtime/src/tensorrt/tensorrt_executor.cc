// TensorRTEngine: loading a plan into an execution context, and execute.
#include "tensorrt_executor.h"

#include <algorithm>

#include "engine_cache.h"
#include "grouped_mm_plugin.h"
#include "log.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;
using nvinfer1::Dims;

Dims to_dims(const std::vector<int64_t>& shape) {
  Dims dims{};
  dims.nbDims = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) dims.d[i] = shape[i];
  return dims;
}

}  // namespace

TensorRTEngine::~TensorRTEngine() {
  {
    ScopedContext scope(cuda_, context_);
#if NV_TENSORRT_MAJOR >= 11
    if (runtime_cache_ != nullptr) {
      std::string error;
      if (!runtime_cache_->save(&error)) log_info("et-trt: runtime cache not saved: " + error);
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

bool TensorRTEngine::load(TensorRTLibrary& trt, const void* plan, size_t size, const std::string& cache_dir,
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
  for (const CheckSpec& check : io_.checks) {
    const char* name = check.output.c_str();
    if (engine_->getTensorIOMode(name) != nvinfer1::TensorIOMode::kOUTPUT ||
        engine_->getTensorDataType(name) != DataType::kBOOL) {
      *error = "the engine has no bool output '" + check.output + "' for its check";
      return false;
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
    if (runtime_cache_ == nullptr) log_info("et-trt: " + note);
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
  check_staging_.resize(io_.checks.size());
  check_values_.assign(io_.checks.size(), 0);
  return true;
}

bool TensorRTEngine::execute(const std::vector<InputTensor>& inputs, OutputBuffers& outputs, std::string* error,
                             bool* invalid_input) {
  std::lock_guard<std::mutex> lock(mutex_);
  *invalid_input = false;
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
  for (size_t i = 0; i < io_.checks.size(); ++i) {
    void* device = nullptr;
    if (!to_device(nullptr, 1, &check_staging_[i], false, &device, error)) return false;
    if (!execution_->setTensorAddress(io_.checks[i].output.c_str(), device)) {
      *error = "TensorRT refused the address of check output '" + io_.checks[i].output + "'";
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
  for (size_t i = 0; i < io_.checks.size(); ++i) {
    const CUresult r = cuda_.cuMemcpyDtoHAsync(&check_values_[i], check_staging_[i].ptr, 1, stream_);
    if (r != CUDA_SUCCESS) {
      *error = cuda_.describe("cuMemcpyDtoHAsync (a check)", r);
      return false;
    }
  }
  const CUresult r = cuda_.cuStreamSynchronize(stream_);
  if (r != CUDA_SUCCESS) {
    *error = cuda_.describe("cuStreamSynchronize (running the engine)", r);
    return false;
  }
  for (size_t i = 0; i < io_.checks.size(); ++i) {
    if (check_values_[i] == 0) {
      *error = io_.checks[i].message;
      *invalid_input = true;
      return false;
    }
  }
  return true;
}

bool TensorRTEngine::to_device(void* data, size_t bytes, DeviceBuffer* staging, bool copy_in, void** device,
                               std::string* error) {
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

}  // namespace et_trt
