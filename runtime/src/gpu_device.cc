#include "gpu_device.h"

namespace et_trt {

bool open_gpu_device(int ordinal, GpuDevice* gpu, std::string* error) {
  gpu->cuda = CudaDriver::get(error);
  if (gpu->cuda == nullptr) return false;
  const CUresult r = gpu->cuda->cuDeviceGet(&gpu->device, ordinal);
  if (r != CUDA_SUCCESS) {
    *error = "CUDA device " + std::to_string(ordinal) + ": " + gpu->cuda->describe("cuDeviceGet", r);
    return false;
  }
  char name[256] = {};
  int major = 0, minor = 0;
  gpu->cuda->cuDeviceGetName(name, sizeof(name) - 1, gpu->device);
  gpu->cuda->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, gpu->device);
  gpu->cuda->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, gpu->device);
  gpu->name = name;
  gpu->capability = major * 10 + minor;
  return true;
}

}  // namespace et_trt
