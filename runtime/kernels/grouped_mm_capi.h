// C ABI over GroupedMMLauncher for Python (ctypes): the eager op
// torch.ops.et_trt.grouped_mm and the device checks and benchmarks use it.
// Functions return 0 on success; on failure they write a message into error.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Mirrors et_trt::kernels::KernelImageView (strings NUL-terminated; format 0 cubin, 1 ptx).
typedef struct EtTrtKernelImage {
  const char* kernel;
  const char* arch;
  int32_t format;
  const uint8_t* image;
  size_t image_size;
  const char* entry;
  const char* dtype;
  int32_t num_warps;
  int32_t shared_bytes;
  int32_t global_scratch_bytes;
  int32_t global_scratch_align;
  int32_t profile_scratch_bytes;
  int32_t block_m;
  int32_t block_n;
  int32_t block_k;
  int32_t persistent;
  const char* ptx_version;
} EtTrtKernelImage;

// Creates a launcher for the current CUDA context; NULL on failure.
void* et_trt_grouped_mm_create(const EtTrtKernelImage* images, int32_t count, char* error, size_t error_size);
int32_t et_trt_grouped_mm_launch(void* launcher, const void* a, const void* b, const int32_t* offs, void* out,
                                 int64_t rows, int64_t k, int64_t n, int64_t groups, int32_t trans_b, void* stream,
                                 char* error, size_t error_size);
// Name of the kernel the last launch used ("" before the first).
const char* et_trt_grouped_mm_last_kernel(void* launcher);
void et_trt_grouped_mm_destroy(void* launcher);

#ifdef __cplusplus
}
#endif
