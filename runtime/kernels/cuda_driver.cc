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
    if (lib == nullptr) {
      const char* why = dlerror();
      load_error = std::string("the NVIDIA driver's libcuda.so.1 cannot be loaded (") + (why ? why : "?") +
                   "): no NVIDIA driver on this machine";
      return;
    }
#define ET_TRT_LOAD(name)                                                                   \
  driver.name = reinterpret_cast<decltype(driver.name)>(dlsym(lib, ET_TRT_SYMBOL(name)));  \
  if (driver.name == nullptr) {                                                             \
    load_error = "libcuda.so.1 lacks " ET_TRT_SYMBOL(name) ": the NVIDIA driver is too old"; \
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
    *error = load_error;
    return nullptr;
  }
  return &driver;
}

std::string CudaDriver::describe(const char* call, CUresult result) const {
  const char* text = nullptr;
  if (cuGetErrorString != nullptr) cuGetErrorString(result, &text);
  return std::string(call) + " failed: " + (text ? text : "unknown error") + " (CUresult " +
         std::to_string(int(result)) + ")";
}

}  // namespace et_trt
