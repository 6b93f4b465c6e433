// Launches the ahead-of-time compiled grouped-GEMM kernel (et_trt_backend/kernels)
// through the CUDA driver API. No Triton, no PyTorch, no libcuda at link time:
// libcuda is dlopen'd on first use.
//
// Semantics (ONNX op et_trt::GroupedMM, contracts 4 and 6): for any offs,
//   start_0 = 0; end_g = clamp(offs[g], start_g, rows); start_{g+1} = end_g
//   out[start_g:end_g] = a[start_g:end_g] @ B_g, every other row of out is zero,
// with B_g = b[g] ([K, N], trans_b = false) or b[g]^T (b[g] is [N, K], trans_b = true).
// a [rows, K], b and out are dense row-major (contiguous) in one dtype (bf16 or
// fp16); offs is int32 [groups] in device memory and is read by the kernel only.
//
// FP8 weights (images of weight_format Float8RowScaled): b is float8 e4m3 [G, N, K]
// (trans_b only) with float32 b_scale [G, N]; a and out are in the images' dtype. Each
// launch first quantizes a per row into the caller's workspace (the "quantize_rows_any"
// image, or "quantize_rows" where K % 16 == 0, or "quantize_rows_whole" where also K <= its
// block_k and rows * K <= 2^21: a_scale[r] = amax_k |a[r, k]| / 448, 1
// where 0; a_q = e4m3(a / a_scale)), then
//   out[r, n] = (sum_k a_q[r, k] * b[g, n, k]) * a_scale[r] * b_scale[g, n]
// with the same group semantics. Both kernels run on the stream; nothing synchronizes. A GEMM image
// that says it waits for the grid before it (waits_for_prior_grid: the fp8 GEMMs from sm_90) is
// launched with programmatic stream serialization: it starts while the quantization runs and waits
// for it on the GPU (griddepcontrol.wait) before reading a_q and a_scale.
//
// INT4 weights (images of weight_format Int4GroupScaled, et_trt_backend/int4_weights.py): b is
// packed INT4 [G, N, K] (uint8 [G, N, round_up(K, 32) / 2], trans_b only) with bfloat16 group
// scales b_scale [G, N, ceil(K / group_size)]; a and out are in the images' dtype and
//   out[r, n] = sum_k a[r, k] * q[g, n, k] * b_scale[g, n, k / group_size]   (float32 sums)
// with the same group semantics. One kernel: the vector-matrix one ("gemv", "gemv_any") where rows
// <= max(groups, kInt4GemvMaxRows), else the tensor-core tiles ("tile", "any").
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image_loading.h"  // KernelImageRef, kernel_dtype_name

namespace et_trt::kernels {

// The images a GroupedMMLauncher takes (KernelImageRef, image_loading.h): the variant says which kernel it is:
//   "wgmma":     hand-written sm_90a kernel (et_trt_backend/kernels/grouped_mm_sm90.cu): rows
//                as wgmma's N in steps of 8; layout nk (trans_b) only; needs K % 8 == 0, N % 8 == 0
//                and at most 1024 groups (else the next variant serves); takes TMA
//                descriptors, which the launcher encodes (and keeps for calls on the
//                same a, b and sizes)
//   "tma":       TMA + wgmma/tcgen05, large tiles; needs K % 8 == 0, N % 8 == 0
//   "tma_small": the same with small tiles, for launches with few rows per group
//   "tile":      pointer loads (cp.async); needs K % 16 == 0, N % 16 == 0
//   "any":       pointer loads; any K and N
//   other variants (e.g. benchmark baselines) are treated like "tile"
//   "quantize_rows": fp8 images only, the row quantization that runs before the GEMM;
//                needs K % 16 == 0 ("quantize_rows_any": any K, and required;
//                "quantize_rows_whole": one read of each row, K % 16 == 0 and K <= block_k,
//                taken for launches of few elements); "quantize_rows_swiglu" (and _whole, _any)
//                the same for launches with Fp8Operands::swiglu, needed only by them (their
//                _whole one taken wherever K <= its block_k)
//   "gemv", "gemv_any": int4 images only, the vector-matrix kernel for few rows per group
//                (non-persistent, one CTA per row and block_n columns); "gemv" needs K % 16 == 0 and
//                N % 16 == 0, "gemv_any" takes any (and is required, as "any" is)
// Every variant needs 16-byte aligned pointers. With fp8 weights the GEMM variants are
// wgmma (K % 16 == 0, N % 8 == 0, at most 1024 groups), tma (K % 16 == 0, N % 16 == 0)
// and any.
// For each call the launcher takes the first variant, among the images loaded for
// this GPU, that accepts K and N, in the order wgmma, tma, tile, others, any; it
// takes tma_small instead of wgmma or tma when rows < 64 * groups or when their
// tiles would not fill every multiprocessor once.

// What a launch with fp8 weights needs beside launch()'s arguments. `workspace` is device
// memory of at least fp8_workspace_bytes(rows, k) bytes, 256-byte aligned, that no other
// work on another stream uses during the launch: a_q [rows, K] at offset 0, a_scale
// float32 [rows] at round_up(rows * k, 256).
// With `swiglu`, a is a gate+up GEMM's output [rows, 2K] and the GEMM's activations are its SwiGLU,
// a'[r, k] = silu(a[r, k]) * a[r, K + k] (each step rounded to the images' dtype), quantized by the
// "quantize_rows_swiglu" images in the same pass: K is the GEMM's, a's rows hold 2K.
struct Fp8Operands {
  const float* b_scale = nullptr;  // [G, N], 16-byte aligned
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool swiglu = false;
  // The FP8 MoE down (MoEGemm::kDown with fp8 images) only: a is already float8 e4m3 [rows, K] with a scale per row
  // and 128 columns, float32 [rows, ceil(K / 128)] (the FP8 gate+up's h and h_scale); nothing is quantized and no
  // workspace is needed: out[r, n] = sum over blocks j of (sum_k in j a[r, k] * b[g, n, k]) * a_block_scale[r, j],
  // times b_scale[g, n].
  const float* a_block_scale = nullptr;
  // The FP8 MoE gate+up (MoEGemm::kGateUp with fp8 images) only: a is already float8 e4m3 [rows, K], the pairs'
  // tokens' rows in pair order, with one scale per token, float32 [tokens]: row r's is a_token_scale[sorted[r] /
  // top_k] (MoEEpilogue's sorted and top_k); nothing is quantized and no workspace is needed.
  const float* a_token_scale = nullptr;
};

// What a launch with INT4 weights needs beside launch()'s arguments.
struct Int4Operands {
  const void* b_scale = nullptr;  // bfloat16 [G, N, ceil(K / group_size)], 16-byte aligned
  int64_t group_size = 0;         // 32, 64 or 128
};
// INT4 launches of at most max(groups, this) rows run the vector-matrix kernel: about one row per group, where
// reading each weight row once per row of a is the whole work (the rows of one group share it through L2). On an
// H100 (benchmarks/results/h100_int4/sweep/, the MoE block) the tiles won from 32 pairs at 8 and 16 experts and from
// 128 at 64; the gemv path beat bf16 up to 8 pairs at 8 and 16 experts and 64 at 64: this limit lies between.
constexpr int64_t kInt4GemvMaxRows = 16;

// The fused MoE experts op's two GEMMs on sm_90a are the wgmma kernel built with an epilogue of its own
// (grouped_mm_sm90.cu's MoE modes; images "moe_gate_up_gated" and "moe_down", variant "wgmma"), run by
// MoEExpertsLauncher through a GroupedMMLauncher made for one of them.
enum class MoEGemm { kNone, kGateUp, kDown };

// What those epilogues read, passed to the kernel as is (grouped_mm_sm90.cu's MoEEpilogue, field for field).
// kGateUp: out is [rows, N / 2] (the activations of W's blocked8 gate and up rows), bias [G, N] or null,
// activation a gated plugin_names.MOE_ACTIVATIONS value with alpha and limit; with fp8 images out is float8 e4m3 with
// a float32 scale per row and 128 columns in out_scale [rows, ceil(N / 256)] (the FP8 down's a and a_block_scale),
// and sorted (each row's pair) and top_k give each row's token. kDown: out is [pairs, N], in the
// images' dtype where the image's y_in_dtype says so (else float32: older exports), row r written at row sorted[r],
// times the routing weight weights[sorted[r]] (float32, or the images' dtype where weights_16bit), plus bias [G, N]
// or null. Rows past offs[G - 1] are neither read into out nor written.
struct MoEEpilogue {
  const void* bias = nullptr;
  const int32_t* sorted = nullptr;
  const void* weights = nullptr;
  int32_t weights_16bit = 0;
  int32_t activation = 0;
  float alpha = 0.f, limit = 0.f;
  float* out_scale = nullptr;
  int32_t top_k = 0;
};

class GroupedMMLauncher {
 public:
  // round_up(rows * k, 256) + 4 * rows: the workspace a launch with fp8 weights needs.
  static size_t fp8_workspace_bytes(int64_t rows, int64_t k);

  // Loads, for the device of the calling thread's current CUDA context, every
  // image that serves it: a cubin for exactly its architecture ("sm_90a" serves
  // compute capability 9.0), else PTX for an equal or lower architecture (JIT
  // by the driver; "a" targets never serve another architecture). All images
  // must share one dtype and one layout. Opts in to the dynamic shared memory
  // each kernel needs. Returns nullptr and sets *error (naming the GPU, the
  // images offered and the fix) when: libcuda cannot be loaded, there is no
  // current context, no image serves this GPU, the driver is too old for the
  // PTX, or a kernel's shared memory, registers or threads exceed the device's.
  // The images must also share one weight format; fp8 ones need a quantize_rows_any image, int4 ones
  // an "any" and a "gemv_any" image.
  // Images of the MoE experts kernels (is_moe_experts_image) are left out, but for `moe` other than kNone,
  // which takes only that GEMM's wgmma image (MoEExpertsLauncher's use).
  static std::unique_ptr<GroupedMMLauncher> create(const std::vector<KernelImageRef>& images,
                                                   std::string* error, MoEGemm moe = MoEGemm::kNone);
  ~GroupedMMLauncher();
  GroupedMMLauncher(const GroupedMMLauncher&) = delete;
  GroupedMMLauncher& operator=(const GroupedMMLauncher&) = delete;

  // Enqueues out = grouped_mm(a, b, offs) on `stream`. Never blocks. Returns
  // false and sets *error on: negative sizes, trans_b or dtype other than the
  // images', sizes the kernels cannot index (rows, K, N or K*N >= 2^31 - 1024), unaligned
  // pointers, or a failed launch. `fp8` must be given iff the images are fp8 (with a
  // b_scale and a large enough, 256-byte aligned workspace); refused otherwise. `int4` likewise
  // iff the images are int4 (an aligned b_scale, group_size 32, 64 or 128). rows == 0 or n == 0 is a no-op; k == 0 or
  // groups == 0 writes zeros. Scratch memory the kernels need is owned by the
  // launcher (allocated at create), so one launcher must not run on two streams
  // at once: use one launcher per stream.
  // Not thread-safe (it keeps the last kernel's name and the wgmma kernel's TMA
  // descriptors of recent calls, reused when a, b and the sizes repeat): one
  // launcher per thread, as the TensorRT plugin has one per execution context.
  // `moe` must be given iff the launcher was made for a MoE GEMM (K and groups then nonzero).
  bool launch(const void* a, const void* b, const int32_t* offs, void* out, int64_t rows, int64_t k,
              int64_t n, int64_t groups, bool trans_b, CUstream stream, std::string* error,
              const Fp8Operands* fp8 = nullptr, const MoEEpilogue* moe = nullptr,
              const Int4Operands* int4 = nullptr);

  // Kernel name the last successful launch used (for the device checks and benchmarks); with fp8
  // weights the GEMM's (the row quantization ran before it).
  const std::string& last_kernel() const;
  // With fp8 weights, the row quantization the last successful launch ran before its GEMM; "" otherwise.
  const std::string& last_quantize() const;

 private:
  struct State;
  explicit GroupedMMLauncher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace et_trt::kernels
