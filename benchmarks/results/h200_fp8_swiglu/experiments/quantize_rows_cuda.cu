// Experiment: the row quantization, one warp per row, the row held in registers (one read).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#ifndef ROWS_PER_CTA
#error ROWS_PER_CTA
#endif
#ifndef PER_LANE
#error PER_LANE
#endif
#ifndef LOAD
#define LOAD __ldg
#endif

namespace {
constexpr float kE4m3Max = 448.f;
constexpr float kSmallScale = 0x1p-64f;
constexpr float kLift = 0x1p64f;
constexpr int kValues = 16 / sizeof(ELEM);

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ uint32_t e4m3_pair(float lo, float hi) {
  uint16_t bits;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(bits) : "f"(hi), "f"(lo));
  return bits;
}

__device__ __forceinline__ float vector_amax(const uint4& bits, float amax) {
  const ELEM* x = reinterpret_cast<const ELEM*>(&bits);
#pragma unroll
  for (int i = 0; i < kValues; ++i) amax = fmaxf(amax, fabsf(to_float(x[i])));
  return amax;
}

__device__ __forceinline__ uint2 vector_quantized(const uint4& bits, float lift, float divisor, float inverse) {
  const ELEM* x = reinterpret_cast<const ELEM*>(&bits);
  float q[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const float lifted = to_float(x[i]) * lift;
    float y = lifted * inverse;
    y = copysignf(fmaf(fmaf(-y, divisor, lifted), inverse, y), lifted);
    q[i] = fminf(fmaxf(y, -kE4m3Max), kE4m3Max);
  }
  return make_uint2(e4m3_pair(q[0], q[1]) | e4m3_pair(q[2], q[3]) << 16,
                    e4m3_pair(q[4], q[5]) | e4m3_pair(q[6], q[7]) << 16);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(ROWS_PER_CTA * 32)
    quantize_rows_cuda(const ELEM* __restrict__ a, uint8_t* __restrict__ a_q, float* __restrict__ a_scale,
                       int rows, int K, void*, void*) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * ROWS_PER_CTA + threadIdx.x / 32;
  if (row >= rows) return;
  const uint4* src = reinterpret_cast<const uint4*>(a + static_cast<int64_t>(row) * K);
  uint2* dst = reinterpret_cast<uint2*>(a_q + static_cast<int64_t>(row) * K);
  const int vectors = K / kValues;
  float amax = 0.f;
#ifndef TWO_READS
  if (vectors <= 32 * PER_LANE) {
    uint4 held[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
      const int v = lane + 32 * j;
      held[j] = v < vectors ? LOAD(src + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) amax = vector_amax(held[j], amax);
    amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
    const float scale = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
    const float lift = scale < kSmallScale ? kLift : 1.f;
    const float divisor = scale * lift, inverse = __fdiv_rn(1.f, divisor);
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
      const int v = lane + 32 * j;
      if (v < vectors) dst[v] = vector_quantized(held[j], lift, divisor, inverse);
    }
    if (lane == 0) a_scale[row] = scale;
    return;
  }
#endif
#pragma unroll 4
  for (int v = lane; v < vectors; v += 32) amax = vector_amax(__ldg(src + v), amax);
  amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
  const float scale = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  const float lift = scale < kSmallScale ? kLift : 1.f;
  const float divisor = scale * lift, inverse = __fdiv_rn(1.f, divisor);
#pragma unroll 4
  for (int v = lane; v < vectors; v += 32) dst[v] = vector_quantized(__ldg(src + v), lift, divisor, inverse);
  if (lane == 0) a_scale[row] = scale;
}
