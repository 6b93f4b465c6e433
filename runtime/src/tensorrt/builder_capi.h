// C entry points of libet_trt_plugin.so for the engine builds outside the
// delegate: at export and in `et-trt check --build` (Python, through ctypes:
// et_trt_backend/engines/onnx_build.py). They run build_plan
// (tensorrt_builder.h), the builder init runs on the device.
//
// Providers: 0 TensorRT, 1 TensorRT for RTX. Messages go to the callback set
// with et_trt_builder_set_log, by level: 0 error, 1 warning, 2 et-trt's
// progress, 3 TensorRT's info and verbose messages.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*et_trt_log_callback)(int32_t level, const char* message);

// Where the builder's messages go from now on (NULL: stderr).
void et_trt_builder_set_log(et_trt_log_callback callback);

// 0 and the provider library's version ("1.7.1.116") where it loads here; 1
// and why it does not (which library is missing, how to install it) in error.
int32_t et_trt_builder_provider(int32_t provider, char* version, size_t version_size, char* error,
                                size_t error_size);

// Builds the engine of a blob, its named data (weights, kernel images) passed
// as `count` (key, bytes, size) entries: with TensorRT for CUDA device
// `device` of this machine (target 0), or with TensorRT for RTX ahead of time
// for compute capability `target` (major * 10 + minor), with no GPU. The
// timing cache at `timing_cache` (NULL or "": none) is read and updated where
// the build can read one. Returns
//   0: built; *plan (free with et_trt_free) of *plan_size bytes, the GPU's
//      name ("" ahead of time), the compute capability built for, and in
//      not_applied the blob's options this build did not apply, one a line;
//   1: the provider, CUDA or a GPU is missing here;
//   2: the provider's ONNX parser refused the partition;
//   3: refused otherwise: the blob or its data, the target, or the build.
// On failure `error` holds what failed, then each message of the parser,
// builder or plugin, each after a record separator ('\x1e').
int32_t et_trt_build_engine(const uint8_t* blob, size_t size, const char* const* keys, const uint8_t* const* data,
                            const size_t* sizes, size_t count, int32_t provider, int32_t target, int32_t device,
                            const char* timing_cache, uint8_t** plan, size_t* plan_size, char* gpu_name,
                            size_t gpu_name_size, int32_t* compute_capability, char* not_applied,
                            size_t not_applied_size, char* error, size_t error_size);

void et_trt_free(void* pointer);

#ifdef __cplusplus
}
#endif
