// Runs a deserialized TensorRT (or TensorRT for RTX) engine: the executor
// half of the engine. Binds inputs and outputs (device pointers directly, host
// pointers through staging buffers reused across calls) and enqueues on the
// engine's own stream. engine_selection.cc decides which plan it loads.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "engine.h"
#include "kernel_images.h"
#include "rtx_runtime_cache.h"
#include "tensorrt_library.h"

namespace et_trt {

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
  ~TensorRTEngine() override;

  // Deserializes `plan` and prepares execution; false (with *error) if this
  // TensorRT cannot read it or it does not match the IO specs.
  // `cache_dir`/`cache_key`: where TensorRT for RTX keeps the runtime cache of this engine.
  bool load(TensorRTLibrary& trt, const void* plan, size_t size, const std::string& cache_dir,
            const std::string& cache_key, std::string* error);

  // One execution at a time per handle: the execution context, stream and
  // staging buffers are shared state.
  bool execute(const std::vector<InputTensor>& inputs, OutputBuffers& outputs, std::string* error,
               bool* invalid_input) override;

 private:
  // `data` as a device pointer: itself if it is device memory, else the
  // staging buffer (grown as needed; inputs are copied in).
  bool to_device(void* data, size_t bytes, DeviceBuffer* staging, bool copy_in, void** device, std::string* error);

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
  std::vector<DeviceBuffer> check_staging_;  // each check's bool, on the device
  std::vector<uint8_t> check_values_;        // and read back after each run
  std::mutex mutex_;
};

}  // namespace et_trt
