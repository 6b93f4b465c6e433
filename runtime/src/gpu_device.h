// The GPU an engine is built for or runs on: a CUDA device of this machine,
// through the CUDA driver (loaded with dlopen, cuda_driver.h).
#pragma once

#include <string>

#include "cuda_driver.h"

namespace et_trt {

struct GpuDevice {
  const CudaDriver* cuda = nullptr;
  CUdevice device = 0;
  std::string name;    // e.g. "NVIDIA H200"
  int capability = 0;  // major * 10 + minor
};

// CUDA device `ordinal`; false and *error (the driver, a GPU or the device
// missing) if it cannot be opened.
bool open_gpu_device(int ordinal, GpuDevice* gpu, std::string* error);

}  // namespace et_trt
