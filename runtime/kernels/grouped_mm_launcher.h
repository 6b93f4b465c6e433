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
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "schema_generated.h"

namespace et_trt::kernels {

// One compiled kernel image: its fields as the blob schema defines them (table
// KernelImage in et_trt_backend/serialization/schema.fbs, as flatc's object
// API holds them) and its bytes (the cubin, or PTX text with or without a NUL
// terminator). Both are borrowed: they only need to live until
// GroupedMMLauncher::create returns.
//
// The variant says which kernel it is:
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
// Every variant needs 16-byte aligned pointers.
// For each call the launcher takes the first variant, among the images loaded for
// this GPU, that accepts K and N, in the order wgmma, tma, tile, others, any; it
// takes tma_small instead of wgmma or tma when rows < 64 * groups or when their
// tiles would not fill every multiprocessor once.
struct KernelImageRef {
  const blob::KernelImageT* fields = nullptr;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
};

// "bf16" or "fp16" (the kernels' element types, as et-trt names them); nullptr for any other.
const char* kernel_dtype_name(blob::DType dtype);

class GroupedMMLauncher {
 public:
  // What a launch of FP8 images (weight_format Float8RowScaled) takes beyond a, b, offs
  // and out: b is e4m3 [G, N, K] with b_scale float32 [G, N]; the activations are
  // quantized per row into `workspace` (256-byte aligned, fp8_workspace_bytes(rows, k)
  // bytes or more): a_q [rows, K] at offset 0, a_scale float32 [rows] at
  // round_up(rows * k, 256).
  struct Fp8Operands {
    const float* b_scale = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
  };
  // round_up(rows * k, 256) + 4 * rows.
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
  static std::unique_ptr<GroupedMMLauncher> create(const std::vector<KernelImageRef>& images,
                                                   std::string* error);
  ~GroupedMMLauncher();
  GroupedMMLauncher(const GroupedMMLauncher&) = delete;
  GroupedMMLauncher& operator=(const GroupedMMLauncher&) = delete;

  // Enqueues out = grouped_mm(a, b, offs) on `stream`. Never blocks. Returns
  // false and sets *error on: negative sizes, trans_b or dtype other than the
  // images', sizes the kernels cannot index (rows, K, N or K*N >= 2^31 - 1024), unaligned
  // pointers, or a failed launch. rows == 0 or n == 0 is a no-op; k == 0 or
  // groups == 0 writes zeros. Scratch memory the kernels need is owned by the
  // launcher (allocated at create), so one launcher must not run on two streams
  // at once: use one launcher per stream.
  // Not thread-safe (it keeps the last kernel's name and the wgmma kernel's TMA
  // descriptors of recent calls, reused when a, b and the sizes repeat): one
  // launcher per thread, as the TensorRT plugin has one per execution context.
  // fp8 must be given iff the launcher's images are fp8; refused with a clear error otherwise.
  bool launch(const void* a, const void* b, const int32_t* offs, void* out, int64_t rows, int64_t k,
              int64_t n, int64_t groups, bool trans_b, CUstream stream, std::string* error,
              const Fp8Operands* fp8 = nullptr);

  // Kernel name the last successful launch used (for the device checks and benchmarks).
  const std::string& last_kernel() const;

 private:
  struct State;
  explicit GroupedMMLauncher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace et_trt::kernels
