// The CUDA driver API, loaded with dlopen (there is no libcuda to link against
// at build time): one table for the kernel launcher and the TensorRT engine.
#pragma once

#include <cuda.h>

#include <string>

namespace et_trt {

struct CudaDriver {
#define ET_TRT_CUDA_FUNCTIONS(X)                                                                           \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet) \
  X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)     \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuStreamCreate)            \
  X(cuStreamDestroy) X(cuStreamSynchronize) X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) \
  X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)             \
  X(cuOccupancyMaxActiveClusters) X(cuMemAlloc)                                                            \
  X(cuMemFree) X(cuMemsetD8Async) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuPointerGetAttribute)       \
  X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuTensorMapEncodeTiled)
#define ET_TRT_DECLARE(name) decltype(&::name) name = nullptr;
  ET_TRT_CUDA_FUNCTIONS(ET_TRT_DECLARE)
#undef ET_TRT_DECLARE

  // The process-wide driver, loaded and initialized once; nullptr and
  // *error (what is missing) if libcuda or a GPU is not there.
  static const CudaDriver* get(std::string* error);

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  std::string describe(CUresult result) const;
  // "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  std::string describe(const char* call, CUresult result) const;
  // Launches `function` on `stream`, grid_x x grid_y blocks of `threads`. With `overlap_previous` it may start
  // while the grid before it on the stream still runs (programmatic dependent launch): the kernel must wait
  // (griddepcontrol.wait) before it reads what that grid writes.
  CUresult launch(CUfunction function, unsigned grid_x, unsigned grid_y, unsigned threads, unsigned shared_bytes,
                  CUstream stream, void** args, bool overlap_previous) const;
};

// Makes a context current on this thread for the scope, restoring the caller's.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver& cuda, CUcontext context) : cuda_(cuda) {
    ok_ = cuda_.cuCtxPushCurrent(context) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    CUcontext popped;
    if (ok_) cuda_.cuCtxPopCurrent(&popped);
  }
  bool ok() const { return ok_; }

 private:
  const CudaDriver& cuda_;
  bool ok_ = false;
};

}  // namespace et_trt
