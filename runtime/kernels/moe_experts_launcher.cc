#include "moe_experts_launcher.h"

#include <algorithm>
#include <utility>

#include "cuda_driver.h"
#include "grouped_mm_launcher.h"

namespace et_trt::kernels {
namespace {

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t round_up(size_t value) { return (value + 255) / 256 * 256; }

// The kernels index pairs, rows and columns with 32-bit integers, plus up to one tile past the end.
constexpr int64_t kIndexLimit = (int64_t{1} << 31) - 1024;
constexpr int64_t kGridYLimit = 65535;
// The dispatch rule (rule_path): on sm_90a the wgmma GEMMs take launches whose hidden and FFN sizes are both at
// least kWgmmaMinSize with at least kWgmmaMinRowsPerExpert rows per expert on average, or both at least
// kWgmmaManyRowsMinSize with at least kWgmmaManyRows rows per expert; the Triton tilings take the rest. Measured on
// an H100 (benchmarks/results/h100_gate_up_epilogue/moe_sweep.md, after the wgmma gate+up epilogue was rolled; the
// block's median, shipped Triton tilings / shipped wgmma build): H = F = 3072 at 128 experts, top-8, 1.09-1.55 from
// 32 rows per expert (512 tokens) to 546 (8740); H = F = 2048 from 128 rows per expert 0.99-1.53 (8 and 16 experts
// tie up to 256 rows and win 1.06 / 1.10 at 512; 64 experts 1.09-1.53; 128 experts, top-8, 1.39), below 128 rows
// 0.85-1.06 (the rule's misses: 64 experts at 16 and 64 rows, 1.06 and 1.05); H = F = 1024 0.72-1.09 (its one
// win, 64 experts x 512 rows, left to the tilings with the ties). 2560 lies between 2048 and 3072, where 32 rows
// was the fewest measured faster (fewer rows read the weights once either way, and the wgmma path's row gather is
// a fifth launch).
constexpr int64_t kWgmmaMinSize = 2560;
constexpr int64_t kWgmmaMinRowsPerExpert = 32;
constexpr int64_t kWgmmaManyRowsMinSize = 2048;
constexpr int64_t kWgmmaManyRows = 128;
constexpr int64_t kWgmmaMaxExperts = 1024;

struct Kernel {
  std::string name;  // "moe_down (small)"
  CUfunction function = nullptr;
  int threads = 0;
  int shared_bytes = 0;
  int block_m = 0, block_n = 0, block_k = 0;
  bool waits_for_prior_grid = false;  // the image's: it may be launched while the grid before it runs
};

// One tiling of the two GEMMs (et_trt_backend/kernels/moe_aot.py's MOE_GEMM_CONFIGS): the images of one variant.
struct Gemms {
  std::string variant;
  Kernel gate_up, gate_up_gated, down;
  int block_m = 0;
  int size_multiple = 16;  // H and F must be multiples of this ("any": 1)
};

// The INT4 vector-matrix kernels of one blocking (moe_aot.py's MOE_GEMV_CONFIGS): "gemv" (H and F multiples of 16)
// or "gemv_any".
struct Gemvs {
  std::string variant;
  Kernel gate_up, gate_up_gated, down;
  int size_multiple = 16;
  Kernel down_combine;  // the down and the combine in one launch, by token (null in older exports)
  // mma.sync builds with BY_EXPERT (int4_mma.py: variant "mma_p<pairs>_by_expert"): program x serves
  // expert x where there are no more experts than pairs, so min(pairs, experts) programs across, not pairs.
  bool by_expert = false;
};
constexpr char kByExpertSuffix[] = "_by_expert";

bool is_gemm_kernel(const std::string& kernel) {
  return kernel == "moe_gate_up" || kernel == "moe_gate_up_gated" || kernel == "moe_down";
}
bool is_gemv_kernel(const std::string& kernel) {
  return kernel == "moe_gemv_gate_up" || kernel == "moe_gemv_gate_up_gated" || kernel == "moe_gemv_down" ||
         kernel == "moe_gemv_down_combine";
}
// The INT4 mma.sync kernels (et_trt_backend/kernels/int4_mma.py): the per-pair kernels' launch and arguments.
bool is_mma_kernel(const std::string& kernel) {
  return kernel == "moe_mma_gate_up" || kernel == "moe_mma_gate_up_gated" || kernel == "moe_mma_down";
}

// The INT4 kernels for a launch (measured on an H100: benchmarks/results/h100_int4/, sweeps 3-5: 8-64 experts, H
// 1024-2048, F 1024-4096, top-2, 4-256 tokens). The vector-matrix kernels (two launches) while pairs <=
// max(experts, kInt4GemvMaxRows) and, where the mma.sync kernels serve, pairs x H x F <= kInt4GemvMaxWork (sweep 8,
// the mma.sync kernels without divisions: at 2^24, 8x1024x1024 x 8 tokens ran 1.34x faster on them and 64x2048x1024
// x 4 tied; at 2^23, 8x1024x1024 x 4, the gemv kernels were 1.22x faster; sweep 9 with this rule, 8 and 16 experts
// of 1024 x 1024: gemv 14.3 us at 4 tokens, mma.sync 18.7 and 20.9 us at 8); the mma.sync kernels above
// (their BY_EXPERT builds beat the tiles by 1.18x-1.58x at 64-256 tokens), the route and the tiles where they do not
// serve. (An export from before the BY_EXPERT builds runs its first-pair builds there too, up to 1.34x slower than
// the tiles at 64-256 tokens on 8 experts: re-export.) Up to kInt4GemvAnyWorkPairs pairs (a token's top-2: each
// pair its own expert, so both paths read the same bytes) the vector-matrix kernels at any size: 16x2048x4096 at one
// token took 26.7 us on them, 34.9 on the mma.sync ones (benchmarks/results/h100_int4_pdl_trigger/). int4_path
// returns one of those three paths, never kRule.
constexpr int64_t kInt4GemvMaxWork = int64_t{1} << 23;
constexpr int64_t kInt4GemvAnyWorkPairs = 2;
MoEInt4Path int4_path(int64_t pairs, int64_t experts, int64_t hidden_size, int64_t ffn, bool mma_serves) {
  if (pairs <= std::max(experts, kInt4GemvMaxRows) &&
      (!mma_serves || pairs <= kInt4GemvAnyWorkPairs || pairs * hidden_size * ffn <= kInt4GemvMaxWork))
    return MoEInt4Path::kGemv;
  return mma_serves ? MoEInt4Path::kMma : MoEInt4Path::kTiles;
}

// Which family of mma.sync builds (the same sweeps): BY_EXPERT (programs by expert) lost 0-17% to the first-pair grid
// at up to one pair per expert on average (its programs request an expert's weights before they know it has pairs)
// and won 4-33% from kInt4ByExpertMinPairs pairs per expert where experts <= kInt4ByExpertMaxExperts and E x H x F
// <= kInt4ByExpertMaxWeights (16x2048x4096: lost 1-12% at 2-4, within 4% at 8), from kInt4ByExpertAnyPairs at any
// expert count (32 and 64 experts: lost up to 15% at 2-4).
constexpr int64_t kInt4ByExpertMinPairs = 2;
constexpr int64_t kInt4ByExpertAnyPairs = 8;
constexpr int64_t kInt4ByExpertMaxExperts = 16;
constexpr int64_t kInt4ByExpertMaxWeights = int64_t{1} << 26;
bool int4_mma_by_expert(int64_t per_expert, int64_t experts, int64_t hidden_size, int64_t ffn) {
  return per_expert >= kInt4ByExpertAnyPairs ||
         (per_expert >= kInt4ByExpertMinPairs && experts <= kInt4ByExpertMaxExperts &&
          experts * hidden_size * ffn <= kInt4ByExpertMaxWeights);
}

// Whether the INT4 kernels after a block's first start while the one before them runs (programmatic dependent
// launch). Measured on an H100 against the same launches without it (benchmarks/results/h100_int4_pdl_trigger/, three
// calls): it saves 3-6% on the vector-matrix kernels at one token of small experts (pairs x H x F 2^21 and 2^22;
// taken up to 2^23) and on the mma.sync BY_EXPERT builds (8-64 tokens); it costs 4% on the vector-matrix kernels at
// one token of 16x2048x4096 (2^24), 8-14% on them at 4-8 pairs (8x1024x1024 at 4 tokens: 16.2 against 14.2 us)
// and 10-16% on the first-pair mma.sync builds at 2-4 tokens (16x2048x4096: 47.1 against 40.7 us). Why is not known:
// with each kernel letting the next launch at its end rather than its start, the cost went, and the saving with it.
constexpr int64_t kInt4OverlapMaxGemvPairs = 2;
bool int4_overlaps(MoEInt4Path path, int64_t pairs, int64_t hidden_size, int64_t ffn, bool by_expert) {
  if (path == MoEInt4Path::kGemv)
    return pairs <= kInt4OverlapMaxGemvPairs && pairs * hidden_size * ffn <= kInt4GemvMaxWork;
  return path != MoEInt4Path::kMma || by_expert;
}

// Byte offsets of the workspace's regions (each 256-byte aligned) and its size.
struct Regions {
  size_t offs = 0, tiles = 0, sorted = 0, h = 0, h_scale = 0, xq = 0, xs = 0, y = 0, bytes = 0;
};
// Columns of the FP8 activations per block scale (et_trt_backend/kernels/moe_fp8.py's SCALE_BLOCK).
constexpr int64_t kFp8ScaleBlock = 128;

Regions regions(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size, int64_t ffn) {
  const size_t pairs = static_cast<size_t>(std::max<int64_t>(tokens * top_k, 0));
  const size_t e = static_cast<size_t>(std::max<int64_t>(experts, 0));
  Regions r;
  r.tiles = round_up(4 * e);
  // The tile table's bound for any tile height: a tile per pair and one partial tile per expert.
  r.sorted = r.tiles + round_up(4 * (1 + 2 * (pairs + e)));
  r.h = r.sorted + round_up(4 * pairs);
  const size_t f = static_cast<size_t>(std::max<int64_t>(ffn, 0));
  r.h_scale = r.h + round_up(2 * pairs * f);
  const size_t t = static_cast<size_t>(std::max<int64_t>(tokens, 0));
  const size_t size = static_cast<size_t>(std::max<int64_t>(hidden_size, 0));
  r.xq = r.h_scale + round_up(4 * pairs * static_cast<size_t>(cdiv(static_cast<int64_t>(f), kFp8ScaleBlock)));
  r.xs = r.xq + round_up(t * size);
  r.y = r.xs + round_up(4 * t);
  r.bytes = r.y + round_up(4 * pairs * static_cast<size_t>(std::max<int64_t>(hidden_size, 0)));
  return r;
}

// Gate row (f / B) * 2B + f % B: the layout's block B.
int64_t layout_block(GateUpLayout layout, int64_t ffn) {
  switch (layout) {
    case GateUpLayout::kConcat:
      return std::max<int64_t>(ffn, 1);
    case GateUpLayout::kInterleaved:
      return 1;
    case GateUpLayout::kBlocked8:
      return 8;
  }
  return 0;
}

}  // namespace

bool parse_gate_up_layout(const std::string& name, GateUpLayout* layout) {
  static const std::pair<const char*, GateUpLayout> names[] = {
      {"concat", GateUpLayout::kConcat}, {"interleaved", GateUpLayout::kInterleaved}, {"blocked8", GateUpLayout::kBlocked8}};
  for (const auto& [text, value] : names)
    if (name == text) {
      *layout = value;
      return true;
    }
  return false;
}

struct MoEExpertsLauncher::State {
  const CudaDriver* cu = nullptr;
  CUcontext context = nullptr;
  blob::DType dtype = blob::DType::BFloat16;
  std::vector<CUmodule> modules;  // every one loaded, unloaded with the launcher
  // by the experts they hold (block_n = E_PAD, block_k = pairs per program); fp8: "moe_route_quantize" (block_m
  // tokens per quantizing program)
  std::vector<Kernel> routes;
  std::vector<Gemms> gemms;       // by block_m
  bool int4 = false;              // the GEMM images' weight format is Int4GroupScaled
  bool fp8 = false;               // ... is Float8RowScaled
  std::vector<Gemvs> gemvs;       // int4: "gemv" first, then "gemv_any"
  std::vector<Gemvs> mmas;        // int4: the mma.sync kernels' builds, by pairs per pass (gate_up.block_m)
  Kernel combine;                 // block_m tokens x block_n columns per program; float32 rows y
  Kernel combine_y_in_dtype;      // the same of rows y in dtype (variant "y_in_dtype"), after a down that writes so
  bool wgmma_y_in_dtype = false;  // the wgmma down's image writes y in dtype (older exports': float32)
  // sm_90a: the wgmma kernel's MoE builds and the gather that copies their rows (block_m rows x block_n columns
  // per program); null where no image serves this GPU.
  std::unique_ptr<GroupedMMLauncher> wgmma_gate_up, wgmma_down;
  Kernel gather;
  MoEGemmPath path = MoEGemmPath::kRule;
  MoEInt4Path int4_path = MoEInt4Path::kRule;
  bool programmatic_launch = true;
  std::string last_kernels;
};

MoEExpertsLauncher::MoEExpertsLauncher(std::unique_ptr<State> state) : state_(std::move(state)) {}

MoEExpertsLauncher::~MoEExpertsLauncher() {
  if (!state_ || state_->cu == nullptr) return;
  const CudaDriver& cu = *state_->cu;
  if (cu.cuCtxPushCurrent(state_->context) != CUDA_SUCCESS) return;
  for (CUmodule module : state_->modules) cu.cuModuleUnload(module);
  CUcontext popped = nullptr;
  cu.cuCtxPopCurrent(&popped);
}

MoEGemmPath MoEExpertsLauncher::rule_path(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size,
                                          int64_t ffn) {
  const int64_t pairs = tokens * top_k, size = std::min(hidden_size, ffn);
  auto rows_per_expert_at_least = [&](int64_t rows) { return pairs / rows >= experts; };
  const bool wgmma = experts > 0 && ((size >= kWgmmaMinSize && rows_per_expert_at_least(kWgmmaMinRowsPerExpert)) ||
                                     (size >= kWgmmaManyRowsMinSize && rows_per_expert_at_least(kWgmmaManyRows)));
  return wgmma ? MoEGemmPath::kWgmma : MoEGemmPath::kTilings;
}

size_t MoEExpertsLauncher::workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden_size,
                                           int64_t ffn) {
  return regions(tokens, top_k, experts, hidden_size, ffn).bytes;
}

std::unique_ptr<MoEExpertsLauncher> MoEExpertsLauncher::create(const std::vector<KernelImageRef>& offered_images,
                                                               std::string* error) {
  const CudaDriver* cu_ptr = CudaDriver::get(error);
  if (cu_ptr == nullptr) return nullptr;
  const CudaDriver& cu = *cu_ptr;
  auto state = std::make_unique<State>();
  state->cu = cu_ptr;
  auto failed = [&](std::string message) -> std::unique_ptr<MoEExpertsLauncher> {
    fail(error, "moe_experts launcher: " + std::move(message));
    MoEExpertsLauncher cleanup(std::move(state));  // unloads what was loaded so far
    return nullptr;
  };
  std::vector<KernelImageRef> images;  // a blob's grouped GEMM images are GroupedMMLauncher's
  for (const KernelImageRef& ref : offered_images) {
    if (ref.fields == nullptr) return failed("a kernel image has no fields");
    if (is_moe_experts_image(*ref.fields)) images.push_back(ref);
  }
  if (images.empty()) return failed("no MoE experts kernel images (kernels \"moe_...\") were given");
  state->dtype = images.front().fields->dtype;
  if (kernel_dtype_name(state->dtype) == nullptr)
    return failed("unsupported dtype in " + images.front().fields->kernel + " (bf16 or fp16)");
  bool formats_seen = false;
  for (const KernelImageRef& ref : images) {
    const blob::KernelImageT& image = *ref.fields;
    if (image.dtype != state->dtype)
      return failed(std::string("all images of one launcher must share one dtype; got ") +
                    kernel_dtype_name(state->dtype) + " and " + image.kernel + " of another");
    if (ref.bytes == nullptr || ref.size == 0) return failed("image " + image.kernel + " is empty");
    if (image.num_warps <= 0 || image.block_m < 0 || image.block_n <= 0)
      return failed("image " + image.kernel + " (" + image.variant + ") has no tile sizes or warp count");
    if (image.global_scratch_bytes > 0 || image.profile_scratch_bytes > 0)
      return failed("image " + image.kernel + " needs scratch memory, which this launcher does not pass; rebuild "
                    "the images and the launcher from one release");
    if (!is_gemm_kernel(image.kernel) && !is_gemv_kernel(image.kernel) && !is_mma_kernel(image.kernel))
      continue;  // route, combine, gather: any
    const bool int4 = image.weight_format == blob::WeightFormat::Int4GroupScaled;
    const bool fp8 = image.weight_format == blob::WeightFormat::Float8RowScaled;
    if (!int4 && !fp8 && image.weight_format != blob::WeightFormat::Dense)
      return failed("image " + image.kernel + " (" + image.variant + ") has a weight format this launcher does not "
                    "run (dense, int4 or fp8)");
    if (formats_seen && (int4 != state->int4 || fp8 != state->fp8))
      return failed("the GEMM images of one launcher must share one weight format; got two of dense, int4 and fp8 "
                    "(make one launcher per format)");
    state->int4 = int4;
    state->fp8 = fp8;
    formats_seen = true;
  }
  Gpu device;
  std::string message;
  if (!current_gpu(cu, &device, &message)) return failed(message);
  state->context = device.context;
  std::string offered;
  const auto chosen = choose_images(
      images, device.cc, [](const blob::KernelImageT& image) { return image.kernel + "/" + image.variant; }, &offered);
  for (const KernelImageRef* ref : chosen) {
    const blob::KernelImageT& image = *ref->fields;
    if (image.variant == "wgmma") {  // GroupedMMLauncher's, below
      if (image.kernel == "moe_down") state->wgmma_y_in_dtype = image.y_in_dtype;
      continue;
    }
    LoadedImage module;
    if (!load_image(cu, *ref, device, &module, &message)) return failed(message);
    state->modules.push_back(module.module);
    Kernel kernel{image.kernel + " (" + image.variant + ")", module.function, module.threads, image.shared_bytes,
                  image.block_m, image.block_n, image.block_k, image.waits_for_prior_grid};
    if (image.kernel == (state->fp8 ? "moe_route_quantize" : "moe_route")) {
      state->routes.push_back(kernel);
    } else if (image.kernel == "moe_combine") {
      (image.y_in_dtype ? state->combine_y_in_dtype : state->combine) = kernel;
    } else if (image.kernel == "moe_gather") {
      state->gather = kernel;
    } else if (is_gemv_kernel(image.kernel)) {
      auto gemvs = std::find_if(state->gemvs.begin(), state->gemvs.end(),
                                [&](const Gemvs& g) { return g.variant == image.variant; });
      if (gemvs == state->gemvs.end()) {
        state->gemvs.push_back({image.variant, {}, {}, {}, image.variant == "gemv_any" ? 1 : 16, {}});
        gemvs = state->gemvs.end() - 1;
      }
      Kernel& slot = image.kernel == "moe_gemv_down"           ? gemvs->down
                     : image.kernel == "moe_gemv_down_combine" ? gemvs->down_combine
                     : image.kernel == "moe_gemv_gate_up"      ? gemvs->gate_up
                                                               : gemvs->gate_up_gated;
      slot = kernel;
    } else if (is_mma_kernel(image.kernel)) {
      auto mma = std::find_if(state->mmas.begin(), state->mmas.end(),
                              [&](const Gemvs& g) { return g.variant == image.variant; });
      if (mma == state->mmas.end()) {
        const size_t suffix = sizeof(kByExpertSuffix) - 1;
        const bool by_expert = image.variant.size() > suffix &&
                               image.variant.compare(image.variant.size() - suffix, suffix, kByExpertSuffix) == 0;
        state->mmas.push_back({image.variant, {}, {}, {}, 16, {}, by_expert});
        mma = state->mmas.end() - 1;
      }
      (image.kernel == "moe_mma_down" ? mma->down : image.kernel == "moe_mma_gate_up" ? mma->gate_up
                                                                                     : mma->gate_up_gated) = kernel;
    } else if (is_gemm_kernel(image.kernel)) {
      auto gemms = std::find_if(state->gemms.begin(), state->gemms.end(),
                                [&](const Gemms& g) { return g.variant == image.variant; });
      if (gemms == state->gemms.end()) {
        state->gemms.push_back({image.variant, {}, {}, {}, image.block_m, image.variant == "any" ? 1 : 16});
        gemms = state->gemms.end() - 1;
      }
      if (image.block_m != gemms->block_m)
        return failed("the " + image.variant + " images of the two GEMMs have tiles of " +
                      std::to_string(gemms->block_m) + " and " + std::to_string(image.block_m) +
                      " rows; they share the route kernel's tile table (rebuild them from one release)");
      (image.kernel == "moe_down" ? gemms->down : image.kernel == "moe_gate_up" ? gemms->gate_up
                                                                                   : gemms->gate_up_gated) = kernel;
    }  // other "moe_" kernels are a newer release's: not used here
  }
  const std::string gpu = device.name + "; images offered: " + offered;
  if (state->routes.empty() || state->combine.function == nullptr)
    return failed(std::string("no ") + (state->fp8 ? "moe_route_quantize" : "moe_route") +
                  " or moe_combine image serves " + gpu +
                  ". Re-export with this architecture in the recipe's kernel_archs");
  state->gemms.erase(std::remove_if(state->gemms.begin(), state->gemms.end(), [](const Gemms& g) {
                       return !g.gate_up.function || !g.gate_up_gated.function || !g.down.function;
                     }), state->gemms.end());
  if (std::none_of(state->gemms.begin(), state->gemms.end(), [](const Gemms& g) { return g.size_multiple == 1; }))
    return failed("no \"any\" variant of moe_gate_up, moe_gate_up_gated and moe_down serves " + gpu +
                  " (the GEMMs for any hidden and FFN size); export the images together "
                  "(moe_aot.moe_experts_images)");
  state->gemvs.erase(std::remove_if(state->gemvs.begin(), state->gemvs.end(), [](const Gemvs& g) {
                       return !g.gate_up.function || !g.gate_up_gated.function || !g.down.function;
                     }), state->gemvs.end());
  std::sort(state->gemvs.begin(), state->gemvs.end(),
            [](const Gemvs& a, const Gemvs& b) { return a.size_multiple > b.size_multiple; });
  state->mmas.erase(std::remove_if(state->mmas.begin(), state->mmas.end(), [](const Gemvs& g) {
                      return !g.gate_up.function || !g.gate_up_gated.function || !g.down.function;
                    }), state->mmas.end());
  std::sort(state->mmas.begin(), state->mmas.end(),
            [](const Gemvs& a, const Gemvs& b) { return a.gate_up.block_m < b.gate_up.block_m; });
  if (state->int4 && (state->gemvs.empty() || state->gemvs.back().size_multiple != 1))
    return failed("no \"gemv_any\" variant of moe_gemv_gate_up, moe_gemv_gate_up_gated and moe_gemv_down serves " +
                  gpu + " (the INT4 vector-matrix kernels for any hidden and FFN size); export the images together "
                  "(moe_aot.moe_experts_images(..., weight_format=\"int4\"))");
  // sm_90a: the wgmma GEMMs where their images serve: both behind the gather (16-bit weights, and FP8 ones where the
  // images have the FP8 gate+up: older exports' FP8 images have the down alone, after the Triton gate+up).
  const bool wgmma_gate_up = state->gather.function != nullptr && !state->int4;
  if (wgmma_gate_up || state->fp8) {
    std::string unavailable;
    if (wgmma_gate_up) state->wgmma_gate_up = GroupedMMLauncher::create(images, &unavailable, MoEGemm::kGateUp);
    state->wgmma_down = GroupedMMLauncher::create(images, &unavailable, MoEGemm::kDown);
  }
  if (state->wgmma_down && state->wgmma_y_in_dtype && state->combine_y_in_dtype.function == nullptr)
    return failed("the wgmma moe_down image writes its rows in " + std::string(kernel_dtype_name(state->dtype)) +
                  " but no moe_combine image of variant y_in_dtype serves " + gpu +
                  "; export the images together (moe_aot.moe_experts_images)");
  std::sort(state->routes.begin(), state->routes.end(),
            [](const Kernel& a, const Kernel& b) { return a.block_n < b.block_n; });
  std::sort(state->gemms.begin(), state->gemms.end(),
            [](const Gemms& a, const Gemms& b) { return a.block_m < b.block_m; });
  return std::unique_ptr<MoEExpertsLauncher>(new MoEExpertsLauncher(std::move(state)));
}

bool MoEExpertsLauncher::launch(const MoEExpertsArgs& a, CUstream stream, std::string* error) {
  const CudaDriver& cu = *state_->cu;
  const std::string shape = "(tokens " + std::to_string(a.tokens) + ", top_k " + std::to_string(a.top_k) +
                            ", experts " + std::to_string(a.experts) + ", hidden " + std::to_string(a.hidden_size) +
                            ", ffn " + std::to_string(a.ffn) + ")";
  auto refuse = [&](const std::string& why) { return fail(error, "moe_experts: " + why + " " + shape); };
  if (a.tokens < 0 || a.top_k < 0 || a.experts < 0 || a.hidden_size < 0 || a.ffn < 0) return refuse("negative size");
  const int32_t activation = static_cast<int32_t>(a.activation);
  if (activation < 0 || activation >= kMoEActivationCount)
    return refuse("unknown activation " + std::to_string(activation) + " (plugin_names.MOE_ACTIVATIONS: 0 to " +
                  std::to_string(kMoEActivationCount - 1) + ")");
  const bool gated = is_gated(a.activation);
  const int64_t block = gated ? layout_block(a.layout, a.ffn) : 1;
  if (block == 0) return refuse("unknown gate_up layout " + std::to_string(static_cast<int32_t>(a.layout)));
  if (gated && a.layout == GateUpLayout::kBlocked8 && a.ffn % 8 != 0)
    return refuse("gate_up layout blocked8 needs ffn % 8 == 0; use concat or interleaved");
  const int64_t pairs = a.tokens * a.top_k, rows = gated ? 2 * a.ffn : a.ffn;
  if (pairs >= kIndexLimit || a.hidden_size >= kIndexLimit || rows >= kIndexLimit ||
      rows * a.hidden_size >= kIndexLimit || a.hidden_size * a.ffn >= kIndexLimit)
    return refuse("sizes exceed the kernels' 32-bit indexing (tokens * top_k, the sizes and one expert's weights "
                  "must be below 2^31 - 1024); split the call");
  const Kernel* route = nullptr;
  for (const Kernel& candidate : state_->routes)
    if (a.experts <= candidate.block_n) {
      route = &candidate;
      break;
    }
  if (route == nullptr)
    return refuse("more experts than the route kernel holds (" + std::to_string(state_->routes.back().block_n) + ")");
  if (a.tokens == 0 || a.hidden_size == 0) {
    state_->last_kernels.clear();
    return true;
  }
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (a.out == nullptr || misaligned(a.out)) return refuse("out must be a 16-byte aligned device pointer");
  if (pairs == 0 || a.experts == 0) {  // no pairs: every row is zero
    CUresult status = cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a.out), 0,
                                         static_cast<size_t>(a.tokens * a.hidden_size * 2), stream);
    if (status != CUDA_SUCCESS) return refuse("zero fill failed: " + cu.describe(status));
    state_->last_kernels = "memset";
    return true;
  }
  for (const void* p : {a.hidden, static_cast<const void*>(a.topk_ids), a.topk_weights, a.w_gate_up, a.w_down})
    if (p == nullptr || misaligned(p))
      return refuse("hidden, topk_ids, topk_weights, w_gate_up and w_down must be 16-byte aligned device pointers");
  if (misaligned(a.b_gate_up) || misaligned(a.b_down)) return refuse("the biases must be 16-byte aligned");
  const Regions r = regions(a.tokens, a.top_k, a.experts, a.hidden_size, a.ffn);
  if (a.workspace == nullptr || a.workspace_bytes < r.bytes || (reinterpret_cast<uintptr_t>(a.workspace) & 255))
    return refuse("needs a 256-byte aligned workspace of workspace_bytes() = " + std::to_string(r.bytes) +
                  " bytes; got " + (a.workspace ? std::to_string(a.workspace_bytes) : std::string("none")));
  if (!state_->int4 && !state_->fp8 && (a.w_gate_up_scale || a.w_down_scale || a.group_size))
    return refuse("weight scales or a group size were given, but the kernel images take dense weights; load the "
                  "int4 or fp8 images for INT4 or FP8 weights");
  if (state_->fp8 && (a.w_gate_up_scale == nullptr || a.w_down_scale == nullptr || misaligned(a.w_gate_up_scale) ||
                      misaligned(a.w_down_scale) || a.group_size != 0))
    return refuse("FP8 weights need w_gate_up_scale and w_down_scale, float32 scales per output channel in 16-byte "
                  "aligned device buffers, and group_size 0");
  if (state_->int4) {
    if (a.w_gate_up_scale == nullptr || a.w_down_scale == nullptr || misaligned(a.w_gate_up_scale) ||
        misaligned(a.w_down_scale))
      return refuse("INT4 weights need w_gate_up_scale and w_down_scale, bfloat16 group scales in 16-byte aligned "
                    "device buffers");
    if (a.group_size != 32 && a.group_size != 64 && a.group_size != 128)
      return refuse("INT4 group_size must be 32, 64 or 128; got " + std::to_string(a.group_size));
  }

  // The tiling: among the variants that take H and F (those of aligned sizes first, then "any"), the lowest tile
  // that holds the average expert's rows, else the tallest. create() keeps an "any" variant, so one is found.
  const Gemms* gemms = nullptr;
  const int64_t per_expert = cdiv(pairs, std::min(a.experts, pairs));
  for (int aligned = 1; aligned >= 0 && gemms == nullptr; --aligned)
    for (const Gemms& candidate : state_->gemms) {  // lowest tiles first
      if ((candidate.size_multiple > 1) != (aligned == 1) || a.hidden_size % candidate.size_multiple ||
          a.ffn % candidate.size_multiple)
        continue;
      gemms = &candidate;
      if (candidate.block_m >= per_expert) break;
    }
  const Kernel& gate_up = gated ? gemms->gate_up_gated : gemms->gate_up;
  const int64_t m_tiles = cdiv(pairs, gemms->block_m) + std::min(a.experts, pairs);
  if (cdiv(a.ffn, gate_up.block_n) > kGridYLimit || cdiv(a.hidden_size, gemms->down.block_n) > kGridYLimit ||
      cdiv(a.hidden_size, state_->combine.block_n) > kGridYLimit)
    return refuse("hidden or FFN size needs more column blocks than a grid holds (65535)");

  const bool wgmma_serves = !state_->fp8 && state_->wgmma_gate_up && state_->wgmma_down && gated &&
                            a.layout == GateUpLayout::kBlocked8 && a.hidden_size % 8 == 0 && a.ffn % 8 == 0 &&
                            a.ffn > 0 && a.experts <= kWgmmaMaxExperts;
  const MoEGemmPath path = state_->path == MoEGemmPath::kRule
                               ? rule_path(a.tokens, a.top_k, a.experts, a.hidden_size, a.ffn)
                               : state_->path;
  const bool wgmma = wgmma_serves && path == MoEGemmPath::kWgmma;
  // FP8: the wgmma kernel's down (block-scaled h, TMA rows of F bytes) by the same rule, after its gate+up (the
  // tokens' e4m3 rows gathered by pair; blocked8 gate and up rows) where the images have it, else the Triton one.
  const bool fp8_wgmma_down = state_->fp8 && state_->wgmma_down && a.hidden_size % 8 == 0 && a.ffn % 16 == 0 &&
                              a.ffn > 0 && a.experts <= kWgmmaMaxExperts && path == MoEGemmPath::kWgmma;
  const bool fp8_wgmma_gate_up = fp8_wgmma_down && state_->wgmma_gate_up && gated &&
                                 a.layout == GateUpLayout::kBlocked8 && a.hidden_size % 16 == 0;
  // INT4 at about one pair per expert: the vector-matrix kernels, one program per pair (no route, no tiles); at
  // tens: the mma.sync kernels, the same launches.
  const Gemvs* gemvs = nullptr;
  const bool mma_serves = !state_->mmas.empty() && a.hidden_size % 16 == 0 && a.ffn % 16 == 0;
  // The rule's INT4 path, or the one set_int4_path forced where it serves.
  const MoEInt4Path forced = state_->int4_path;
  MoEInt4Path int4_choice = int4_path(pairs, a.experts, a.hidden_size, a.ffn, mma_serves);
  if (forced == MoEInt4Path::kGemv || forced == MoEInt4Path::kTiles || (forced == MoEInt4Path::kMma && mma_serves))
    int4_choice = forced;
  if (!state_->int4) int4_choice = MoEInt4Path::kTiles;
  if (int4_choice == MoEInt4Path::kMma) {
    // The rule's family (the other where the images hold none of it), then the fewest pairs per pass that hold
    // twice the average expert's (skew).
    bool by_expert = int4_mma_by_expert(per_expert, a.experts, a.hidden_size, a.ffn);
    if (std::none_of(state_->mmas.begin(), state_->mmas.end(),
                     [&](const Gemvs& g) { return g.by_expert == by_expert; }))
      by_expert = !by_expert;
    for (const Gemvs& candidate : state_->mmas) {
      if (candidate.by_expert != by_expert) continue;
      gemvs = &candidate;
      if (candidate.gate_up.block_m >= 2 * per_expert) break;
    }
  }
  if (int4_choice == MoEInt4Path::kGemv)
    for (const Gemvs& candidate : state_->gemvs)  // "gemv" first; create() keeps a "gemv_any"
      if (a.hidden_size % candidate.size_multiple == 0 && a.ffn % candidate.size_multiple == 0) {
        gemvs = &candidate;
        break;
      }
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(a.workspace);
  CUdeviceptr offs = base + r.offs, tiles = base + r.tiles, sorted = base + r.sorted, h = base + r.h, y = base + r.y;
  CUdeviceptr h_scale = base + r.h_scale, xq = base + r.xq, xs = base + r.xs;
  CUdeviceptr hidden = reinterpret_cast<CUdeviceptr>(a.hidden), ids = reinterpret_cast<CUdeviceptr>(a.topk_ids);
  CUdeviceptr weights = reinterpret_cast<CUdeviceptr>(a.topk_weights), out = reinterpret_cast<CUdeviceptr>(a.out);
  CUdeviceptr w_gate_up = reinterpret_cast<CUdeviceptr>(a.w_gate_up), w_down = reinterpret_cast<CUdeviceptr>(a.w_down);
  CUdeviceptr b_gate_up = reinterpret_cast<CUdeviceptr>(a.b_gate_up), b_down = reinterpret_cast<CUdeviceptr>(a.b_down);
  CUdeviceptr no_scratch = 0;  // Triton's two trailing scratch pointers: these kernels need none
  int32_t pairs_arg = static_cast<int32_t>(pairs), experts = static_cast<int32_t>(a.experts);
  int32_t block_m = gemms->block_m, tokens = static_cast<int32_t>(a.tokens);
  int32_t size = static_cast<int32_t>(a.hidden_size), ffn = static_cast<int32_t>(a.ffn);
  int32_t top_k = static_cast<int32_t>(a.top_k), block_arg = static_cast<int32_t>(block);
  int32_t has_gate_up_bias = a.b_gate_up != nullptr, has_down_bias = a.b_down != nullptr;
  int32_t weights_16bit = !a.weights_fp32, activation_arg = activation;
  float alpha = a.alpha, limit = a.limit;

  std::string ran;
  // A kernel whose image waits for the grid before it (griddepcontrol.wait before it touches anything but its
  // weights) starts while that grid runs, if that grid is this launch's: its launch, and its first weight loads,
  // overlap that grid's tail. The first kernel starts after all work before it, which may write anything (an eager
  // caller may write the weights just before).
  // INT4: only where it was measured to help (int4_overlaps).
  const bool overlaps = state_->programmatic_launch &&
                        (!state_->int4 ||
                         int4_overlaps(int4_choice, pairs, a.hidden_size, a.ffn, gemvs != nullptr && gemvs->by_expert));
  auto run = [&](const Kernel& kernel, int64_t grid_x, int64_t grid_y, void** args) {
    const bool overlap = kernel.waits_for_prior_grid && overlaps && !ran.empty();
    CUresult status = cu.launch(kernel.function, static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y),
                                static_cast<unsigned>(kernel.threads), static_cast<unsigned>(kernel.shared_bytes),
                                stream, args, overlap);
    if (status != CUDA_SUCCESS) return refuse("launching " + kernel.name + " failed: " + cu.describe(status));
    ran += (ran.empty() ? "" : " + ") + kernel.name;
    return true;
  };
  // moe_experts.py's signatures, then the two scratch pointers.
  void* route_args[] = {&ids, &offs, &sorted, &tiles, &pairs_arg, &experts, &block_m, &no_scratch, &no_scratch};
  void* gate_up_args[] = {&hidden, &sorted, &w_gate_up, &b_gate_up, &tiles,  &offs,          &h,
                          &size,   &ffn,    &top_k,     &block_arg, &activation_arg, &alpha, &limit,
                          &has_gate_up_bias, &no_scratch, &no_scratch};
  void* down_args[] = {&h,    &sorted, &w_down, &b_down,        &weights,       &tiles,      &offs,      &y,
                       &size, &ffn,    &has_down_bias, &weights_16bit, &no_scratch, &no_scratch};
  void* combine_args[] = {&y, &ids, &out, &tokens, &size, &top_k, &experts, &no_scratch, &no_scratch};
  // INT4: the scales and the group size follow the dense arguments (moe_experts.py, int4_kernels.py).
  CUdeviceptr gate_up_scale = reinterpret_cast<CUdeviceptr>(a.w_gate_up_scale);
  CUdeviceptr down_scale = reinterpret_cast<CUdeviceptr>(a.w_down_scale);
  int32_t group_size = static_cast<int32_t>(a.group_size);
  if (gemvs) {
    const Kernel& gemv_gate_up = gated ? gemvs->gate_up_gated : gemvs->gate_up;
    void* gemv_gate_up_args[] = {&hidden,    &ids,   &w_gate_up, &gate_up_scale,  &b_gate_up, &h,
                                 &pairs_arg, &experts, &size,    &ffn,            &top_k,     &block_arg,
                                 &group_size, &activation_arg, &alpha, &limit, &has_gate_up_bias, &no_scratch,
                                 &no_scratch};
    void* gemv_down_args[] = {&h,     &ids,   &w_down,     &down_scale,    &b_down,        &weights,
                              &y,     &pairs_arg, &experts, &size,         &ffn,           &group_size,
                              &has_down_bias, &weights_16bit, &no_scratch, &no_scratch};
    void* gemv_down_combine_args[] = {&h,    &ids,        &w_down,        &down_scale,    &b_down,
                                      &weights, &out,     &tokens,        &experts,       &size,
                                      &ffn,  &top_k,      &group_size,    &has_down_bias, &weights_16bit,
                                      &no_scratch, &no_scratch};
    const int64_t programs = gemvs->by_expert ? std::min(pairs, a.experts) : pairs;
    if (a.ffn > 0 && !run(gemv_gate_up, programs, cdiv(a.ffn, gemv_gate_up.block_n), gemv_gate_up_args)) return false;
    if (gemvs->down_combine.function != nullptr) {
      if (!run(gemvs->down_combine, a.tokens, cdiv(a.hidden_size, gemvs->down_combine.block_n),
               gemv_down_combine_args))
        return false;
    } else if (!run(gemvs->down, programs, cdiv(a.hidden_size, gemvs->down.block_n), gemv_down_args) ||
               !run(state_->combine, cdiv(a.tokens, state_->combine.block_m),
                    cdiv(a.hidden_size, state_->combine.block_n), combine_args)) {
      return false;
    }
    state_->last_kernels = ran;
    return true;
  }
  void* int4_gate_up_args[] = {&hidden, &sorted, &w_gate_up, &b_gate_up, &tiles, &offs, &h, &size, &ffn, &top_k,
                               &block_arg, &activation_arg, &alpha, &limit, &has_gate_up_bias, &gate_up_scale,
                               &group_size, &no_scratch, &no_scratch};
  void* int4_down_args[] = {&h, &sorted, &w_down, &b_down, &weights, &tiles, &offs, &y, &size, &ffn, &has_down_bias,
                            &weights_16bit, &down_scale, &group_size, &no_scratch, &no_scratch};
  // FP8: the weight scales beside the weights, the activations' block scales beside h (moe_fp8.py).
  // FP8: the route's launch also quantizes hidden into xq and xs, in programs after the route's.
  int32_t route_programs = static_cast<int32_t>(cdiv(pairs, route->block_k));
  void* fp8_route_args[] = {&ids,    &offs, &sorted, &tiles, &pairs_arg,      &experts,    &block_m,   &hidden,
                            &xq,     &xs,   &tokens, &size,  &route_programs, &no_scratch, &no_scratch};
  const int64_t route_grid =
      route_programs + (state_->fp8 ? cdiv(a.tokens, route->block_m) : 0);
  void* fp8_gate_up_args[] = {&xq, &xs, &sorted, &w_gate_up, &gate_up_scale, &b_gate_up, &tiles, &offs, &h, &h_scale,
                              &size, &ffn, &top_k, &block_arg, &activation_arg, &alpha, &limit, &has_gate_up_bias,
                              &no_scratch, &no_scratch};
  void* fp8_down_args[] = {&h, &h_scale, &sorted, &w_down, &down_scale, &b_down, &weights, &tiles, &offs, &y, &size,
                           &ffn, &has_down_bias, &weights_16bit, &no_scratch, &no_scratch};
  void** gate_up_launch_args = state_->fp8 ? fp8_gate_up_args : state_->int4 ? int4_gate_up_args : gate_up_args;
  void** down_launch_args = state_->fp8 ? fp8_down_args : state_->int4 ? int4_down_args : down_args;
  if (!run(*route, route_grid, 1, state_->fp8 ? fp8_route_args : route_args)) return false;
  // The wgmma down's epilogue (dense and FP8 alike): the routing weights and bias, rows by pair (y_in_dtype).
  MoEEpilogue down_epilogue;
  down_epilogue.bias = a.b_down;
  down_epilogue.sorted = reinterpret_cast<const int32_t*>(sorted);
  down_epilogue.weights = a.topk_weights;
  down_epilogue.weights_16bit = weights_16bit;
  const auto* offsets = reinterpret_cast<const int32_t*>(offs);
  // The wgmma gate+up's rows in pair order for its TMA loads, in y's region (y is written after they are read):
  // `source`'s rows of `columns` 16-bit elements.
  CUdeviceptr gathered = y;
  auto gather = [&](CUdeviceptr& source, int32_t& columns) {
    void* gather_args[] = {&source, &sorted, &offs, &gathered, &columns, &experts, &top_k, &no_scratch, &no_scratch};
    return run(state_->gather, cdiv(pairs, state_->gather.block_m), cdiv(columns, state_->gather.block_n),
               gather_args);
  };
  // The wgmma gate+up's epilogue (dense and FP8 alike).
  MoEEpilogue gate_up_epilogue;
  gate_up_epilogue.bias = a.b_gate_up;
  gate_up_epilogue.activation = activation;
  gate_up_epilogue.alpha = a.alpha;
  gate_up_epilogue.limit = a.limit;
  if (wgmma) {
    if (!gather(hidden, size)) return false;
    std::string message;
    if (!state_->wgmma_gate_up->launch(reinterpret_cast<const void*>(gathered), a.w_gate_up, offsets,
                                       reinterpret_cast<void*>(h), pairs, a.hidden_size, rows, a.experts, true, stream,
                                       &message, nullptr, &gate_up_epilogue) ||
        !state_->wgmma_down->launch(reinterpret_cast<const void*>(h), a.w_down, offsets, reinterpret_cast<void*>(y),
                                    pairs, a.ffn, a.hidden_size, a.experts, true, stream, &message, nullptr,
                                    &down_epilogue))
      return refuse(message);
    ran += " + moe_gate_up_gated (wgmma) + moe_down (wgmma)";
  } else if (fp8_wgmma_down) {
    if (fp8_wgmma_gate_up) {
      // xq's rows: the gather copies 16-bit elements, so a row of H e4m3 values is H / 2 of them (H % 16 == 0).
      int32_t half_size = size / 2;
      if (!gather(xq, half_size)) return false;
      Fp8Operands tokens_quantized;
      tokens_quantized.b_scale = static_cast<const float*>(a.w_gate_up_scale);
      tokens_quantized.a_token_scale = reinterpret_cast<const float*>(xs);
      gate_up_epilogue.sorted = reinterpret_cast<const int32_t*>(sorted);
      gate_up_epilogue.out_scale = reinterpret_cast<float*>(h_scale);
      gate_up_epilogue.top_k = top_k;
      std::string message;
      if (!state_->wgmma_gate_up->launch(reinterpret_cast<const void*>(gathered), a.w_gate_up, offsets,
                                         reinterpret_cast<void*>(h), pairs, a.hidden_size, rows, a.experts, true,
                                         stream, &message, &tokens_quantized, &gate_up_epilogue))
        return refuse(message);
      ran += " + moe_gate_up_gated (wgmma)";
    } else if (!run(gate_up, m_tiles, cdiv(a.ffn, gate_up.block_n), gate_up_launch_args)) {
      return false;
    }
    Fp8Operands quantized;
    quantized.b_scale = static_cast<const float*>(a.w_down_scale);
    quantized.a_block_scale = reinterpret_cast<const float*>(h_scale);
    std::string message;
    if (!state_->wgmma_down->launch(reinterpret_cast<const void*>(h), a.w_down, offsets, reinterpret_cast<void*>(y),
                                    pairs, a.ffn, a.hidden_size, a.experts, true, stream, &message, &quantized,
                                    &down_epilogue))
      return refuse(message);
    ran += " + moe_down (wgmma)";
  } else {
    if (a.ffn > 0 && !run(gate_up, m_tiles, cdiv(a.ffn, gate_up.block_n), gate_up_launch_args)) return false;
    if (!run(gemms->down, m_tiles, cdiv(a.hidden_size, gemms->down.block_n), down_launch_args)) return false;
  }
  // The wgmma down's rows are in dtype where its image says so; the other downs' are float32.
  const Kernel& combine = (wgmma || fp8_wgmma_down) && state_->wgmma_y_in_dtype ? state_->combine_y_in_dtype
                                                                                 : state_->combine;
  if (!run(combine, cdiv(a.tokens, combine.block_m), cdiv(a.hidden_size, combine.block_n), combine_args)) return false;
  state_->last_kernels = ran;
  return true;
}

void MoEExpertsLauncher::set_gemm_path(MoEGemmPath path) { state_->path = path; }

void MoEExpertsLauncher::set_int4_path(MoEInt4Path path) { state_->int4_path = path; }

void MoEExpertsLauncher::set_programmatic_launch(bool enabled) { state_->programmatic_launch = enabled; }

const std::string& MoEExpertsLauncher::last_kernels() const { return state_->last_kernels; }

}  // namespace et_trt::kernels
