// What the grouped GEMM's and the MoE experts' launchers share: which kernel image serves the current GPU,
// and loading one through the CUDA driver API (no libcuda at link time: cuda_driver.h).
#pragma once

#include <cuda.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "schema_generated.h"

namespace et_trt::kernels {

// One compiled kernel image: its fields as the blob schema defines them (table
// KernelImage in et_trt_backend/serialization/schema.fbs, as flatc's object
// API holds them) and its bytes (the cubin, or PTX text with or without a NUL
// terminator). Both are borrowed: they only need to live until a launcher's
// create returns.
struct KernelImageRef {
  const blob::KernelImageT* fields = nullptr;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
};

// Whether an image is one of the MoE experts kernels' (kernel name "moe_...", moe_experts_launcher.h), not the
// grouped GEMM's: a blob holding both hands each launcher its own.
bool is_moe_experts_image(const blob::KernelImageT& image);

// "bf16" or "fp16" (the kernels' element types, as et-trt names them); nullptr for any other.
const char* kernel_dtype_name(blob::DType dtype);

// The device of the calling thread's current CUDA context.
struct Gpu {
  CUcontext context = nullptr;
  int cc = 0;  // compute capability, major * 10 + minor
  int sms = 0;
  int smem_optin = 0;  // shared memory a block may opt in to
  int driver_version = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3 (sm_90)", for messages
};
// false and *error when there is no current context.
bool current_gpu(const CudaDriver& cu, Gpu* gpu, std::string* error);

// For each key(image), the image that serves compute capability `cc` best: a cubin for exactly its
// architecture ("sm_90a" serves 9.0 only) or the closest lower one of its major, else PTX for an equal or
// lower architecture (JIT by the driver). *offered lists every image ("kernel@arch", "(ptx)" for PTX).
std::vector<const KernelImageRef*> choose_images(const std::vector<KernelImageRef>& images, int cc,
                                                 const std::function<std::string(const blob::KernelImageT&)>& key,
                                                 std::string* offered);

// Per kernel (variant, dtype, layout and weight format), the image among `images` that serves a GPU of
// compute capability `cc` best (choose_images' rule), in `images`' order: what the launchers would load there.
std::vector<const KernelImageRef*> images_for_gpu(const std::vector<KernelImageRef>& images, int cc);

// One image loaded into the current context.
struct LoadedImage {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int threads = 0;         // num_warps * 32
  int registers = 0;       // per thread
  int blocks_per_sm = 0;   // resident at once with its threads and shared memory
};
// Loads the image's module and entry, opts in to its dynamic shared memory above 48 KiB, and checks that a
// block of it fits this GPU (threads, registers, shared memory). false and *error (naming the image, the GPU
// and the fix) otherwise; *loaded's module is then unloaded already.
bool load_image(const CudaDriver& cu, const KernelImageRef& ref, const Gpu& gpu, LoadedImage* loaded,
                std::string* error);

}  // namespace et_trt::kernels
