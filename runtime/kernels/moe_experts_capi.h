// C ABI over MoEExpertsLauncher for Python (ctypes): the eager op torch.ops.et_trt.moe_experts, the device
// checks and the benchmarks use it. In the same library as grouped_mm_capi.h. Functions return 0 on success;
// on failure they write a message into error.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// MoEExpertsArgs (moe_experts_launcher.h) with C types: activation is plugin_names.MOE_ACTIVATIONS' value,
// gate_up_layout the index in plugin_names.MOE_GATE_UP_LAYOUTS, weights_fp32 0 or 1.
typedef struct {
  const void* hidden;
  const int32_t* topk_ids;
  const void* topk_weights;
  int32_t weights_fp32;
  const void* w_gate_up;
  const void* w_down;
  const void* b_gate_up;
  const void* b_down;
  void* out;
  int64_t tokens, top_k, experts, hidden_size, ffn;
  int32_t activation;
  int32_t gate_up_layout;
  float alpha, limit;
  void* workspace;
  size_t workspace_bytes;
  // INT4 expert weights (a launcher of int4 images): the bfloat16 group scales and the group size; FP8 ones (fp8
  // images): the float32 scales per output channel and 0; else null, 0.
  const void* w_gate_up_scale;
  const void* w_down_scale;
  int64_t group_size;
} et_trt_moe_experts_args;

// As et_trt_grouped_mm_create: `kernels` is a flatbuffer of the blob schema whose `kernels` are the images,
// `images[i]` their bytes. Images of other kernels than the MoE experts' are ignored.
void* et_trt_moe_experts_create(const uint8_t* kernels, size_t kernels_size, const uint8_t* const* images,
                                const size_t* image_sizes, int32_t count, char* error, size_t error_size);
int32_t et_trt_moe_experts_launch(void* launcher, const et_trt_moe_experts_args* args, void* stream, char* error,
                                  size_t error_size);
size_t et_trt_moe_experts_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size,
                                          int64_t ffn);
// The GEMM path of later launches: 0 the launcher's rule, 1 the wgmma GEMMs wherever they serve, 2 the Triton
// tilings only (MoEGemmPath). Returns 0, or 1 for a path out of range (nothing changed).
int32_t et_trt_moe_experts_set_gemm_path(void* launcher, int32_t path);
// The INT4 path of later launches: 0 the launcher's rule, 1 the vector-matrix kernels, 2 the mma.sync kernels where
// they serve, 3 the tiles (MoEInt4Path). Returns 0, or 1 for a path out of range (nothing changed).
int32_t et_trt_moe_experts_set_int4_path(void* launcher, int32_t path);
// Whether later launches use programmatic dependent launch where the images allow it (1, the default) or not (0):
// MoEExpertsLauncher::set_programmatic_launch. Returns 0, or 1 for a null launcher.
int32_t et_trt_moe_experts_set_programmatic_launch(void* launcher, int32_t enabled);
// The launcher's dispatch rule (MoEExpertsLauncher::rule_path) for a launch of these sizes: 1 where it takes the
// wgmma GEMMs if they serve it, else 2 (MoEGemmPath's values). Needs no GPU.
int32_t et_trt_moe_experts_rule_path(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size, int64_t ffn);
// The kernels the last launch ran, joined by " + " ("" before the first).
const char* et_trt_moe_experts_last_kernels(void* launcher);
void et_trt_moe_experts_destroy(void* launcher);

#ifdef __cplusplus
}
#endif
