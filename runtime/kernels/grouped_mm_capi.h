// C ABI over GroupedMMLauncher for Python (ctypes): the eager op
// torch.ops.et_trt.grouped_mm and the device checks and benchmarks use it.
// Functions return 0 on success; on failure they write a message into error.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Creates a launcher for the current CUDA context; NULL on failure. `kernels`
// is a flatbuffer of the blob schema (et_trt_backend/serialization/schema.fbs,
// root Blob, file identifier "ETRT", no et-trt blob header) whose `kernels` are
// the images; `images[i]` holds the `image_sizes[i]` bytes of kernels[i]
// (`count` of them, one per kernel). Nothing is kept past the call.
void* et_trt_grouped_mm_create(const uint8_t* kernels, size_t kernels_size, const uint8_t* const* images,
                               const size_t* image_sizes, int32_t count, char* error, size_t error_size);
int32_t et_trt_grouped_mm_launch(void* launcher, const void* a, const void* b, const int32_t* offs, void* out,
                                 int64_t rows, int64_t k, int64_t n, int64_t groups, int32_t trans_b, void* stream,
                                 char* error, size_t error_size);
// The same with fp8 weights (GroupedMMLauncher::launch with Fp8Operands): b float8 e4m3 [G, N, K],
// b_scale float32 [G, N], workspace of at least et_trt_grouped_mm_fp8_workspace_bytes(rows, k) bytes;
// swiglu 1: a is a gate+up output [rows, 2K], the GEMM's activations its SwiGLU (Fp8Operands::swiglu).
int32_t et_trt_grouped_mm_launch_fp8(void* launcher, const void* a, const void* b, const int32_t* offs, void* out,
                                     int64_t rows, int64_t k, int64_t n, int64_t groups, int32_t trans_b,
                                     const float* b_scale, void* workspace, size_t workspace_bytes, int32_t swiglu,
                                     void* stream, char* error, size_t error_size);
size_t et_trt_grouped_mm_fp8_workspace_bytes(int64_t rows, int64_t k);
// The same with int4 weights (GroupedMMLauncher::launch with Int4Operands): b packed INT4 [G, N, K] (uint8
// [G, N, round_up(K, 32) / 2]), b_scale bfloat16 [G, N, ceil(K / group_size)], group_size 32, 64 or 128.
int32_t et_trt_grouped_mm_launch_int4(void* launcher, const void* a, const void* b, const int32_t* offs, void* out,
                                      int64_t rows, int64_t k, int64_t n, int64_t groups, int32_t trans_b,
                                      const void* b_scale, int64_t group_size, void* stream, char* error,
                                      size_t error_size);
// Name of the kernel the last launch used ("" before the first).
const char* et_trt_grouped_mm_last_kernel(void* launcher);
// With fp8 weights, the row quantization the last launch ran before its GEMM ("" otherwise).
const char* et_trt_grouped_mm_last_quantize(void* launcher);
void et_trt_grouped_mm_destroy(void* launcher);
// Which kernel images the launcher loads on a GPU of compute capability `cc` (major * 10 + minor):
// `kernels` as et_trt_grouped_mm_create takes it (no image bytes needed), `chosen[i]` set to 1 for
// each of its `count` images that serves it best (image_loading.h's images_for_gpu), else 0.
int32_t et_trt_grouped_mm_images_for_gpu(const uint8_t* kernels, size_t kernels_size, int32_t cc, uint8_t* chosen,
                                         int32_t count, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif
