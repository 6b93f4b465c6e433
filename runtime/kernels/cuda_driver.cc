#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace et_trt {
namespace {

// cuda.h maps some names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2):
// expand the macro before making the string, so dlsym asks for the right one.
#define ET_TRT_STRINGIFY(x) #x
#define ET_TRT_SYMBOL(x) ET_TRT_STRINGIFY(x)

}  // namespace

const CudaDriver* CudaDriver::get(std::string* error) {
  static CudaDriver driver;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      load_error = std::string("cannot load the CUDA driver library libcuda.so.1 (") + (why ? why : "not found") +
                   "); install the NVIDIA driver or add its directory to LD_LIBRARY_PATH";
      return;
    }
#define ET_TRT_LOAD(name)                                                                   \
  driver.name = reinterpret_cast<decltype(driver.name)>(dlsym(lib, ET_TRT_SYMBOL(name)));  \
  if (driver.name == nullptr) {                                                             \
    load_error = "the CUDA driver library lacks " ET_TRT_SYMBOL(name) "; update the driver";  \
    return;                                                                                 \
  }
    ET_TRT_CUDA_FUNCTIONS(ET_TRT_LOAD)
#undef ET_TRT_LOAD
    const CUresult init = driver.cuInit(0);
    if (init != CUDA_SUCCESS) {
      load_error = driver.describe("cuInit", init) + ": no usable NVIDIA GPU";
      return;
    }
    int count = 0;
    if (driver.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) load_error = "no CUDA GPU is visible";
  });
  if (!load_error.empty()) {
    if (error) *error = load_error;
    return nullptr;
  }
  return &driver;
}

std::string CudaDriver::describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &text);
  return std::string(name ? name : "CUDA error " + std::to_string(int(result))) +
         (text ? std::string(" (") + text + ")" : "");
}

std::string CudaDriver::describe(const char* call, CUresult result) const {
  return std::string(call) + " failed: " + describe(result);
}

CUresult CudaDriver::launch(CUfunction function, unsigned grid_x, unsigned grid_y, unsigned threads,
                            unsigned shared_bytes, CUstream stream, void** args, bool overlap_previous) const {
  CUlaunchConfig config = {};
  config.gridDimX = grid_x;
  config.gridDimY = grid_y;
  config.gridDimZ = config.blockDimY = config.blockDimZ = 1;
  config.blockDimX = threads;
  config.sharedMemBytes = shared_bytes;
  config.hStream = stream;
  CUlaunchAttribute overlap = {};
  overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  overlap.value.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  return cuLaunchKernelEx(&config, function, args, nullptr);
}

}  // namespace et_trt
