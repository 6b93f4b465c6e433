#include "moe_experts_capi.h"

#include <memory>
#include <string>

#include "capi_images.h"
#include "moe_experts_launcher.h"

using et_trt::kernels::MoEExpertsLauncher;
using et_trt::kernels::capi::copy_error;

extern "C" ET_TRT_EXPORT void* et_trt_moe_experts_create(const uint8_t* kernels, size_t kernels_size,
                                                         const uint8_t* const* images, const size_t* image_sizes,
                                                         int32_t count, char* error, size_t error_size) {
  et_trt::kernels::capi::Images parsed;
  std::string message;
  if (!et_trt::kernels::capi::read_images(kernels, kernels_size, images, image_sizes, count, &parsed, &message)) {
    copy_error("moe_experts: " + message, error, error_size);
    return nullptr;
  }
  std::unique_ptr<MoEExpertsLauncher> launcher = MoEExpertsLauncher::create(parsed.refs, &message);
  if (!launcher) copy_error(message, error, error_size);
  return launcher.release();
}

extern "C" ET_TRT_EXPORT int32_t et_trt_moe_experts_launch(void* launcher, const et_trt_moe_experts_args* args,
                                                           void* stream, char* error, size_t error_size) {
  if (launcher == nullptr || args == nullptr) {
    copy_error("moe_experts: null launcher or arguments", error, error_size);
    return 1;
  }
  et_trt::kernels::MoEExpertsArgs a;
  a.hidden = args->hidden;
  a.topk_ids = args->topk_ids;
  a.topk_weights = args->topk_weights;
  a.weights_fp32 = args->weights_fp32 != 0;
  a.w_gate_up = args->w_gate_up;
  a.w_down = args->w_down;
  a.b_gate_up = args->b_gate_up;
  a.b_down = args->b_down;
  a.out = args->out;
  a.tokens = args->tokens;
  a.top_k = args->top_k;
  a.experts = args->experts;
  a.hidden_size = args->hidden_size;
  a.ffn = args->ffn;
  a.activation = static_cast<et_trt::kernels::MoEActivation>(args->activation);
  a.layout = static_cast<et_trt::kernels::GateUpLayout>(args->gate_up_layout);
  a.alpha = args->alpha;
  a.limit = args->limit;
  a.workspace = args->workspace;
  a.workspace_bytes = args->workspace_bytes;
  a.w_gate_up_scale = args->w_gate_up_scale;
  a.w_down_scale = args->w_down_scale;
  a.group_size = args->group_size;
  std::string message;
  const bool ok = static_cast<MoEExpertsLauncher*>(launcher)->launch(a, static_cast<CUstream>(stream), &message);
  if (!ok) copy_error(message, error, error_size);
  return ok ? 0 : 1;
}

extern "C" ET_TRT_EXPORT size_t et_trt_moe_experts_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts,
                                                                   int64_t hidden_size, int64_t ffn) {
  return MoEExpertsLauncher::workspace_bytes(tokens, top_k, experts, hidden_size, ffn);
}

extern "C" ET_TRT_EXPORT int32_t et_trt_moe_experts_set_gemm_path(void* launcher, int32_t path) {
  if (launcher == nullptr || path < 0 || path > static_cast<int32_t>(et_trt::kernels::MoEGemmPath::kTilings)) return 1;
  static_cast<MoEExpertsLauncher*>(launcher)->set_gemm_path(static_cast<et_trt::kernels::MoEGemmPath>(path));
  return 0;
}

extern "C" ET_TRT_EXPORT int32_t et_trt_moe_experts_set_int4_path(void* launcher, int32_t path) {
  if (launcher == nullptr || path < 0 || path > static_cast<int32_t>(et_trt::kernels::MoEInt4Path::kTiles)) return 1;
  static_cast<MoEExpertsLauncher*>(launcher)->set_int4_path(static_cast<et_trt::kernels::MoEInt4Path>(path));
  return 0;
}

extern "C" ET_TRT_EXPORT int32_t et_trt_moe_experts_set_programmatic_launch(void* launcher, int32_t enabled) {
  if (launcher == nullptr) return 1;
  static_cast<MoEExpertsLauncher*>(launcher)->set_programmatic_launch(enabled != 0);
  return 0;
}

extern "C" ET_TRT_EXPORT int32_t et_trt_moe_experts_rule_path(int64_t tokens, int64_t top_k, int64_t experts,
                                                              int64_t hidden_size, int64_t ffn) {
  return static_cast<int32_t>(MoEExpertsLauncher::rule_path(tokens, top_k, experts, hidden_size, ffn));
}

extern "C" ET_TRT_EXPORT const char* et_trt_moe_experts_last_kernels(void* launcher) {
  return launcher ? static_cast<MoEExpertsLauncher*>(launcher)->last_kernels().c_str() : "";
}

extern "C" ET_TRT_EXPORT void et_trt_moe_experts_destroy(void* launcher) {
  delete static_cast<MoEExpertsLauncher*>(launcher);
}
