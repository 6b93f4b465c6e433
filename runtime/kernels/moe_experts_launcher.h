// Launches the ahead-of-time compiled fused MoE experts kernels (et_trt_backend/kernels/moe_experts.py,
// issue 32's MoEExperts op) through the CUDA driver API, as GroupedMMLauncher does the grouped GEMM.
//
// Semantics (et_trt_backend/moe_experts.py, the one definition):
//   out[t] = sum over j < k with 0 <= e = topk_ids[t, j] < E of
//            topk_weights[t, j] * down_e(act(gate_up_e(hidden[t])))
// products in float32, the gate+up output (bias included) rounded to the images' dtype before the
// activation, the activation's result rounded to it, the down output kept in float32 through the
// weighted sum (over j in order), rounded once. Ids outside [0, E) contribute nothing and are never
// used as an index.
//
// One launch enqueues, with no device-to-host synchronisation:
//   moe_route    counts and offsets per expert and the token-expert pairs sorted by expert (stable)
//   moe_gate_up  grouped GEMM of the rows gathered from hidden by that order, the activation in its
//                epilogue, into the workspace [pairs, F]
//   moe_down     grouped GEMM of those rows with the routing weight (and bias) in its epilogue, each
//                row written in float32 where its pair (t, j) lies
//   moe_combine  out[t] = the sum over j of its pairs' rows, rounded
// (four launches). On sm_90a, with the wgmma kernel's MoE images ("moe_gate_up_gated" and "moe_down" of
// variant "wgmma", run through GroupedMMLauncher) and "moe_gather": for gated activations, blocked8 rows,
// hidden and FFN sizes multiples of 8 and at most 1024 experts, where rule_path() says kWgmma, the two GEMMs are
// those, behind moe_gather, which copies the rows in pair order for their TMA loads (five); that down writes its
// rows in the images' dtype where its image says so (y_in_dtype: half the bytes to write and to combine), and the
// combine of variant "y_in_dtype" reads them. Elsewhere the Triton tilings serve every size.
//
// INT4 expert weights (images of weight_format Int4GroupScaled, et_trt_backend/int4_weights.py): w_gate_up and
// w_down are packed INT4 (uint8 [E, N1, round_up(H, 32) / 2] and [E, H, round_up(F, 32) / 2]) with bfloat16 group
// scales (w_gate_up_scale [E, N1, ceil(H / g)], w_down_scale [E, H, ceil(F / g)], g = group_size); the semantics
// are the same with the weights q * scale (exact in float32). With pairs <= max(experts, kInt4GemvMaxRows) the
// block is the vector-matrix kernels, one program per pair (gate+up) or token (down) and block of weight rows, no
// route: moe_gemv_gate_up, moe_gemv_down_combine (two launches; images of an older export without it: moe_gemv_down,
// float32 rows by pair, and moe_combine); above, where the export has them and H and F are multiples of 16, the
// mma.sync kernels: moe_mma_gate_up, moe_mma_down (one program per expert and block of weight rows, float32 rows by
// pair), moe_combine, in the build (first-pair grid or BY_EXPERT, pairs per pass) that moe_experts_launcher.cc's
// int4_path and int4_mma_by_expert pick; elsewhere the four launches above with the GEMMs' INT4 builds.
//
// FP8 expert weights (images of weight_format Float8RowScaled, et_trt_backend/moe_experts_fp8.py): w_gate_up and
// w_down are float8 e4m3 ([E, N1, H], [E, H, F]) with float32 scales per output channel (w_gate_up_scale [E, N1],
// w_down_scale [E, H]); the GEMMs' inputs are quantized to e4m3: hidden per token by extra programs of the route's
// launch (moe_route_quantize), the activation in blocks of 1 x 128 along K by the gate+up GEMM's epilogue, which
// writes it with its block scales for the down GEMM. Four launches: moe_route_quantize, the GEMMs' FP8 builds,
// moe_combine. On sm_90a, where rule_path takes the wgmma GEMMs and H % 8 == 0, F % 16 == 0, the down is the wgmma
// kernel's FP8 build (image "moe_down", variant "wgmma", fp8), run through GroupedMMLauncher, its rows combined as
// the bf16 wgmma down's.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image_loading.h"  // KernelImageRef, is_moe_experts_image

namespace et_trt::kernels {

// plugin_names.MOE_ACTIVATIONS, value for value (tests/test_moe_experts.py checks the two agree).
enum class MoEActivation : int32_t {
  kSwiGLU = 0,     // silu(g) * u
  kGeGLUTanh = 1,  // gelu_tanh(g) * u
  kGeGLUErf = 2,   // gelu(g) * u
  kGptOssGLU = 3,  // g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g)
  kSiLU = 4,
  kGeluTanh = 5,
  kGeluErf = 6,
  kReLU2 = 7,  // relu(x)^2
};
constexpr int32_t kMoEActivationCount = 8;
// Gated activations take a gate+up output of 2F columns; the others F.
constexpr bool is_gated(MoEActivation activation) { return static_cast<int32_t>(activation) <= 3; }

// plugin_names.MOE_GATE_UP_LAYOUTS: where feature f's gate and up rows lie among an expert's 2F gate+up
// weight rows, as a block B: gate row (f / B) * 2B + f % B, up row that + B.
enum class GateUpLayout : int32_t {
  kConcat = 0,       // B = F: gate rows [0, F), up rows [F, 2F)
  kInterleaved = 1,  // B = 1: gate rows even, up rows odd (GPT-OSS)
  kBlocked8 = 2,     // B = 8 (F % 8 == 0): the layout the kernels read fastest; the lowering writes it
};
// The layout of the ONNX attribute's string ("concat", "interleaved", "blocked8"); false for any other.
bool parse_gate_up_layout(const std::string& name, GateUpLayout* layout);

// One call's operands: device pointers, 16-byte aligned, dense row-major.
struct MoEExpertsArgs {
  const void* hidden = nullptr;        // [tokens, hidden_size], the images' dtype
  const int32_t* topk_ids = nullptr;   // [tokens, top_k], any values
  const void* topk_weights = nullptr;  // [tokens, top_k]: float32 where weights_fp32, else the images' dtype
  bool weights_fp32 = true;
  const void* w_gate_up = nullptr;  // [experts, N1, hidden_size]; N1 = 2 * ffn for gated activations, else ffn
  const void* w_down = nullptr;     // [experts, hidden_size, ffn]
  const void* b_gate_up = nullptr;  // [experts, N1] or null
  const void* b_down = nullptr;     // [experts, hidden_size] or null
  void* out = nullptr;              // [tokens, hidden_size], the images' dtype
  int64_t tokens = 0, top_k = 0, experts = 0, hidden_size = 0, ffn = 0;
  MoEActivation activation = MoEActivation::kSwiGLU;
  GateUpLayout layout = GateUpLayout::kConcat;  // gated activations only
  float alpha = 1.702f, limit = 7.0f;           // kGptOssGLU's
  // INT4 weights only (launchers of int4 images; null and 0 otherwise): the group scales and the group size.
  // FP8 weights (launchers of fp8 images): the float32 scales per output channel, group_size 0.
  const void* w_gate_up_scale = nullptr;
  const void* w_down_scale = nullptr;
  int64_t group_size = 0;
  // At least workspace_bytes(tokens, top_k, experts, hidden_size, ffn) bytes, 256-byte aligned, used by no
  // other work during the launch.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Which GEMMs a launch runs: the launcher's rule, or one path wherever the shape allows it (benchmarks and tests
// that time or check a path at shapes the rule gives the other; the Triton tilings serve where wgmma cannot).
enum class MoEGemmPath : int32_t {
  kRule = 0,    // the launcher's dispatch rule
  kWgmma = 1,   // sm_90a's wgmma GEMMs wherever their images, the activation, layout and sizes allow
  kTilings = 2  // the Triton tilings only
};

// Which INT4 kernels a launch runs (int4 images only): the launcher's rule, or one path wherever it serves
// (benchmarks/int4_gemv_sweep.py and benchmarks/int4_mma_check.py run the mma.sync builds at every shape; the
// rule's path where the forced one does not serve: mma.sync needs hidden and FFN sizes multiples of 16).
enum class MoEInt4Path : int32_t {
  kRule = 0,  // the launcher's rule (int4_path in the .cc)
  kGemv = 1,  // the vector-matrix kernels
  kMma = 2,   // the mma.sync kernels
  kTiles = 3  // the route and the tensor-core tiles
};

class MoEExpertsLauncher {
 public:
  // The workspace one launch needs: the offsets and the sorted pairs, the activations [pairs, F] in the
  // images' dtype (2 bytes; FP8: 1 byte) and their FP8 block scales [pairs, ceil(F / 128)] in float32, FP8 hidden
  // [tokens, H] and its scales [tokens], and the weighted down rows [pairs, H] in float32
  // (pairs = tokens * top_k). The same for every weight format.
  static size_t workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size, int64_t ffn);

  // Loads, for the device of the calling thread's current CUDA context, every MoE experts image that
  // serves it (as GroupedMMLauncher::create picks them; images of other kernels are ignored). They must
  // share one dtype and hold a moe_route, moe_combine and an "any" variant of moe_gate_up and moe_down for
  // this GPU. The GEMM images must share one weight format (dense, int4 or fp8: the launcher's); int4 ones also
  // need the "gemv_any" variant of moe_gemv_gate_up, moe_gemv_gate_up_gated and moe_gemv_down. nullptr and
  // *error (naming the GPU, the images offered and the fix) otherwise.
  static std::unique_ptr<MoEExpertsLauncher> create(const std::vector<KernelImageRef>& images, std::string* error);
  ~MoEExpertsLauncher();
  MoEExpertsLauncher(const MoEExpertsLauncher&) = delete;
  MoEExpertsLauncher& operator=(const MoEExpertsLauncher&) = delete;

  // Enqueues the block on `stream`; never blocks. false and *error on: negative sizes, sizes the kernels
  // cannot index (tokens * top_k, hidden_size, ffn or an expert's weights at 2^31 - 1024 or more), more
  // experts than the route kernel holds, an activation or layout out of range, blocked8 with ffn % 8 != 0,
  // null or unaligned pointers, a short or unaligned workspace, int4 scales or group size given to a dense
  // launcher, missing or invalid ones for an int4 or fp8 launcher, or a failed launch. tokens == 0 or
  // hidden_size == 0 is a no-op; top_k, experts or ffn == 0 writes zeros. Not thread-safe, one stream at a
  // time (as GroupedMMLauncher).
  bool launch(const MoEExpertsArgs& args, CUstream stream, std::string* error);

  // The path later launches take (kRule until set).
  void set_gemm_path(MoEGemmPath path);
  // The INT4 path later launches take (kRule until set).
  void set_int4_path(MoEInt4Path path);
  // Whether later launches start the kernels whose images wait for the grid before them (KernelImage's
  // waits_for_prior_grid) while that grid, the launch's previous kernel, still runs: programmatic dependent
  // launch, on until set (benchmarks time both); INT4 launches only on the paths where it was measured to help (the
  // .cc's int4_overlaps). A launch's first kernel always starts after the work before it.
  void set_programmatic_launch(bool enabled);

  // The dispatch rule, the one place it is written (the C ABI's et_trt_moe_experts_rule_path asks it): kWgmma where
  // a launch of these sizes takes the wgmma GEMMs if they serve it (sm_90a with their images, gated activation,
  // blocked8 rows, hidden and FFN sizes multiples of 8, at most 1024 experts), else kTilings. Where they do not
  // serve, a launch takes the Triton tilings whatever this says. The measurements behind it: the .cc.
  static MoEGemmPath rule_path(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size, int64_t ffn);

  // The kernels the last successful launch ran, in order, joined by " + " (device checks, benchmarks).
  const std::string& last_kernels() const;

 private:
  struct State;
  explicit MoEExpertsLauncher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace et_trt::kernels
