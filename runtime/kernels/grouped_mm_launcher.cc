#include "grouped_mm_launcher.h"

#include "cuda_driver.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace et_trt::kernels {
namespace {

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

// Preference rank of a variant; lower is tried first.
int variant_rank(const std::string& variant) {
  if (variant == "wgmma" || variant == "tma" || variant == "tma_small") return 0;
  if (variant == "tile") return 1;
  if (variant == "any") return 3;
  return 2;
}

struct LoadedKernel {
  std::string name;
  std::string variant;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int threads = 0;
  int shared_bytes = 0;
  int block_m = 0;
  int block_n = 0;
  int max_grid = 0;  // CTAs; a multiple of `cluster`
  int sms = 0;
  int cluster = 1;  // CTAs per cluster, from the kernel's required cluster width
  size_t scratch_stride = 0;  // global scratch bytes per CTA, aligned
  size_t profile_stride = 0;
  int k_multiple = 1;  // K must be a multiple of this
  int max_k = 0;       // and at most this, where nonzero ("quantize_rows_whole": each row in registers)
  int64_t max_elements = 0;  // rows * K at most, where nonzero ("quantize_rows_whole": faster for few only)
  int n_multiple = 1;  // and N of this
  // Takes TMA descriptors instead of a and b, and no scratch (grouped_mm_sm90.cu).
  bool tensor_maps = false;
  // The image's: it reads nothing the grid before it writes until it has waited for that grid
  // (griddepcontrol.wait), so it may be launched while that grid runs.
  bool waits_for_prior_grid = false;
};

// grouped_mm_sm90.cu's group table holds this many groups (MAX_GROUPS in et_trt_backend/kernels/sm90.py);
// its tiles are 128 weight rows by 8, 16, ..., 256 rows of a, which a cluster's CTAs load in shares of
// whole 8-row groups: one descriptor of a per share height, 8 to 256 / cluster rows.
constexpr int64_t kWgmmaMaxGroups = 1024;
constexpr int kWgmmaMaxWidth = 256, kWgmmaWidthStep = 8, kWgmmaTileFeatures = 128;

// Up to this many elements (rows * K) the row quantization is latency-bound, and "quantize_rows_whole" (one read
// of each row) beats "quantize_rows" (two reads of blocks of 4 rows) where K > 1024 or rows are few. H200: up to
// 1.7 us faster at robot sizes, 0.3 us slower at 512 rows of K 1024; at the MoE shapes (86M elements) 2-24% slower.
// "quantize_rows_swiglu_whole" has no such bound: computing each SwiGLU once rather than in both reads makes one
// read faster at the MoE shapes too (H200: the down stage 7% faster at 3500 and 8740 tokens).
constexpr int64_t kWholeRowsMaxElements = int64_t{1} << 21;

// How a row quantization reads its rows: two reads of K % 16 == 0 rows ("quantize_rows"), one read of each
// row (K % 16 == 0, K <= block_k; "_whole") or any K ("_any"); the "quantize_rows_swiglu" ones the same.
enum class Blocking { kNotQuantization, kTwoReads, kWholeRows, kAnyK };

Blocking blocking_of(const std::string& variant) {
  for (const std::string form : {"quantize_rows", "quantize_rows_swiglu"}) {
    if (variant == form) return Blocking::kTwoReads;
    if (variant == form + "_whole") return Blocking::kWholeRows;
    if (variant == form + "_any") return Blocking::kAnyK;
  }
  return Blocking::kNotQuantization;
}

// A TMA descriptor over a row-major tensor of `type` (16-bit floats, or UINT8 for e4m3 bits),
// dims innermost first, with 128-byte swizzle and zero fill past the edges.
CUresult encode_tensor_map(const CudaDriver& cu, CUtensorMap* map, CUtensorMapDataType type, const void* base,
                           int rank, const cuuint64_t* dims, const cuuint32_t* box) {
  cuuint64_t strides[2];  // bytes between consecutive indices of dims 1..rank-1
  cuuint64_t stride = dims[0] * (type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2);
  for (int i = 1; i < rank; ++i) {
    strides[i - 1] = stride;
    stride *= dims[i];
  }
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return cu.cuTensorMapEncodeTiled(map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

size_t round_up(size_t value, size_t align) { return align <= 1 ? value : (value + align - 1) / align * align; }

// The TMA descriptors of one wgmma launch (grouped_mm_sm90.cu's first two parameters: a as
// [rows, K] in boxes of 8, 16, ..., 256 / cluster rows by 128 bytes, passed as one array of
// which the kernel reads as many as its cluster size makes; b as [G, N, K] in boxes of
// 1 x 128 x 128 bytes) and what they were encoded for: they depend on nothing else. With fp8
// weights `a` is the quantized copy in the workspace.
struct WgmmaMaps {
  const LoadedKernel* kernel = nullptr;  // null: the slot holds nothing valid
  const void* a = nullptr;
  const void* b = nullptr;
  int64_t rows = 0, k = 0, n = 0, groups = 0;
  struct {
    CUtensorMap by_height[kWgmmaMaxWidth / kWgmmaWidthStep];
  } a_maps;
  CUtensorMap b_map;

  bool encoded_for(const LoadedKernel* kernel_, const void* a_, const void* b_, int64_t rows_, int64_t k_,
                   int64_t n_, int64_t groups_) const {
    return kernel == kernel_ && a == a_ && b == b_ && rows == rows_ && k == k_ && n == n_ && groups == groups_;
  }

  // Encodes every descriptor for these arguments; on failure the slot holds nothing valid.
  CUresult encode(const CudaDriver& cu, CUtensorMapDataType type, const LoadedKernel* kernel_, const void* a_,
                  const void* b_, int64_t rows_, int64_t k_, int64_t n_, int64_t groups_) {
    kernel = nullptr;
    const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(k_), static_cast<cuuint64_t>(rows_)};
    const cuuint64_t b_dims[3] = {static_cast<cuuint64_t>(k_), static_cast<cuuint64_t>(n_),
                                  static_cast<cuuint64_t>(groups_)};
    const cuuint32_t box_k = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 128 : 64;  // one 128-byte swizzled row
    const cuuint32_t b_box[3] = {box_k, kWgmmaTileFeatures, 1};
    CUresult status = encode_tensor_map(cu, &b_map, type, b_, 3, b_dims, b_box);
    const int heights = kWgmmaMaxWidth / kernel_->cluster / kWgmmaWidthStep;
    for (int i = 0; i < heights && status == CUDA_SUCCESS; ++i) {
      const cuuint32_t a_box[2] = {box_k, static_cast<cuuint32_t>(kWgmmaWidthStep * (i + 1))};
      status = encode_tensor_map(cu, &a_maps.by_height[i], type, a_, 2, a_dims, a_box);
    }
    if (status != CUDA_SUCCESS) return status;
    kernel = kernel_;
    a = a_;
    b = b_;
    rows = rows_;
    k = k_;
    n = n_;
    groups = groups_;
    return CUDA_SUCCESS;
  }
};

}  // namespace

struct GroupedMMLauncher::State {
  const CudaDriver* cu = nullptr;
  CUcontext context = nullptr;
  blob::DType dtype = blob::DType::BFloat16;
  bool trans_b = false;
  bool fp8 = false;                   // weight_format Float8RowScaled
  bool int4 = false;                  // weight_format Int4GroupScaled
  MoEGemm moe = MoEGemm::kNone;  // the MoE experts GEMM whose epilogue the one (wgmma) image has
  std::vector<LoadedKernel> kernels;  // the GEMMs, in preference order
  std::vector<LoadedKernel> quantize;  // fp8: the row quantizations run before each GEMM, preferred first
  std::vector<LoadedKernel> swiglu_quantize;  // fp8: the same of a gate+up output's SwiGLU (Fp8Operands::swiglu)
  size_t workspace_bytes = 0;
  CUdeviceptr workspace = 0;
  std::string last_kernel;
  std::string last_quantize;
  // Descriptors of the last few wgmma launches: a model calls each layer on the same buffers
  // again, and encoding 17 descriptors took ~1 us of a launch's ~8 us of host time (H200).
  std::array<WgmmaMaps, 8> wgmma_maps;
  size_t next_maps_slot = 0;  // replaced in turn
};

GroupedMMLauncher::GroupedMMLauncher(std::unique_ptr<State> state) : state_(std::move(state)) {}

GroupedMMLauncher::~GroupedMMLauncher() {
  if (!state_ || state_->cu == nullptr) return;
  const CudaDriver& cu = *state_->cu;
  // Release in the context the modules were loaded into, whatever is current now.
  if (cu.cuCtxPushCurrent(state_->context) != CUDA_SUCCESS) return;
  if (state_->workspace) cu.cuMemFree(state_->workspace);
  for (auto& kernel : state_->kernels) cu.cuModuleUnload(kernel.module);
  for (auto& kernel : state_->quantize) cu.cuModuleUnload(kernel.module);
  CUcontext popped = nullptr;
  cu.cuCtxPopCurrent(&popped);
}

std::unique_ptr<GroupedMMLauncher> GroupedMMLauncher::create(const std::vector<KernelImageRef>& offered_images,
                                                             std::string* error, MoEGemm moe) {
  // A blob's MoE experts images are MoEExpertsLauncher's; it makes launchers for its wgmma GEMMs here.
  const std::string moe_kernel = moe == MoEGemm::kGateUp ? "moe_gate_up_gated" : moe == MoEGemm::kDown ? "moe_down" : "";
  std::vector<KernelImageRef> images;
  for (const KernelImageRef& ref : offered_images)
    if (ref.fields == nullptr || (moe == MoEGemm::kNone ? !is_moe_experts_image(*ref.fields)
                                                        : ref.fields->kernel == moe_kernel && ref.fields->variant == "wgmma"))
      images.push_back(ref);
  const CudaDriver* cu_ptr = CudaDriver::get(error);
  if (cu_ptr == nullptr) return nullptr;
  const CudaDriver& cu = *cu_ptr;
  auto state = std::make_unique<State>();
  state->cu = cu_ptr;
  state->moe = moe;
  auto failed = [&](std::string message) -> std::unique_ptr<GroupedMMLauncher> {
    fail(error, "grouped_mm launcher: " + std::move(message));
    GroupedMMLauncher cleanup(std::move(state));  // unloads what was loaded so far
    return nullptr;
  };

  if (images.empty()) return failed("no kernel images were given");
  for (const KernelImageRef& ref : images) {
    if (ref.fields == nullptr) return failed("a kernel image has no fields");
  }
  const blob::KernelImageT& first = *images.front().fields;
  state->dtype = first.dtype;
  state->trans_b = first.trans_b;
  state->fp8 = first.weight_format == blob::WeightFormat::Float8RowScaled;
  state->int4 = first.weight_format == blob::WeightFormat::Int4GroupScaled;
  const auto described = [](const blob::KernelImageT& image) {
    const char* dtype = kernel_dtype_name(image.dtype);
    return image.kernel + " (" + (dtype ? dtype : "unsupported dtype") + ", " + (image.trans_b ? "nk" : "kn") +
           (image.weight_format == blob::WeightFormat::Float8RowScaled   ? ", fp8 weights"
            : image.weight_format == blob::WeightFormat::Int4GroupScaled ? ", int4 weights"
                                                                           : "") +
           ")";
  };
  for (const KernelImageRef& ref : images) {
    const blob::KernelImageT& image = *ref.fields;
    if (image.variant.empty()) return failed("image " + image.kernel + " names no variant");
    if (image.dtype != state->dtype || image.trans_b != state->trans_b || image.weight_format != first.weight_format)
      return failed("all images of one launcher must share dtype, layout and weight format; got " + described(first) +
                    " and " + described(image));
    if (image.weight_format != blob::WeightFormat::Dense &&
        image.weight_format != blob::WeightFormat::Float8RowScaled &&
        image.weight_format != blob::WeightFormat::Int4GroupScaled)
      return failed("image " + image.kernel + " has an unknown weight format; rebuild the images and launcher from "
                    "one release");
    if ((state->fp8 || state->int4) && !image.trans_b)
      return failed("image " + described(image) + " takes quantized weights stored [G, K, N]; fp8 and int4 weights "
                    "are [G, N, K] (trans_b) only");
    if (!state->fp8 && blocking_of(image.variant) != Blocking::kNotQuantization)
      return failed("image " + described(image) + " is a row quantization for fp8 weights among dense images");
    if (ref.bytes == nullptr || ref.size == 0) return failed("image " + image.kernel + " is empty");
    if (image.block_m <= 0 || image.block_n <= 0 || image.num_warps <= 0)
      return failed("image " + image.kernel + " has no tile sizes or warp count");
  }
  if (kernel_dtype_name(state->dtype) == nullptr)
    return failed("unsupported dtype in " + described(first) + " (bf16 or fp16)");

  Gpu device;
  std::string no_gpu;
  if (!current_gpu(cu, &device, &no_gpu)) return failed(no_gpu);
  state->context = device.context;
  const int cc = device.cc, sms = device.sms;
  const std::string& gpu = device.name;
  CUresult status = CUDA_SUCCESS;

  // For each variant, the image that serves this GPU best.
  std::string offered;
  const std::vector<const KernelImageRef*> chosen =
      choose_images(images, cc, [](const blob::KernelImageT& image) { return image.variant; }, &offered);
  if (chosen.empty())
    return failed("no kernel image serves this GPU, " + gpu + "; images offered: " + offered +
                  ". Re-export with this architecture in the recipe's kernel_archs (e.g. \"sm_" + std::to_string(cc) +
                  (cc >= 90 ? "a" : "") + "\")");

  for (const KernelImageRef* ref : chosen) {
    const blob::KernelImageT* image = ref->fields;
    LoadedKernel kernel;
    kernel.name = image->kernel;
    kernel.variant = image->variant;
    kernel.threads = image->num_warps * 32;
    kernel.shared_bytes = image->shared_bytes;
    kernel.block_m = image->block_m;
    kernel.block_n = image->block_n;
    kernel.tensor_maps = kernel.variant == "wgmma";
    kernel.waits_for_prior_grid = image->waits_for_prior_grid;
    const bool tma = kernel.variant.rfind("tma", 0) == 0 || kernel.tensor_maps;
    const Blocking blocking = blocking_of(kernel.variant);
    if (kernel.variant == "any" || kernel.variant == "gemv_any" || blocking == Blocking::kAnyK) {
      kernel.k_multiple = kernel.n_multiple = 1;
    } else if (blocking == Blocking::kTwoReads) {  // 16-byte vector loads and stores along K
      kernel.k_multiple = 16;
    } else if (blocking == Blocking::kWholeRows) {  // the same, a whole row per block
      kernel.k_multiple = 16;
      kernel.max_k = image->block_k;
      if (kernel.variant == "quantize_rows_whole") kernel.max_elements = kWholeRowsMaxElements;
    } else if (!state->fp8) {
      kernel.k_multiple = kernel.n_multiple = tma ? 8 : 16;
    } else {  // 1-byte operands: TMA's 16-byte strides need K % 16; wgmma's epilogue stores 8 outputs
      kernel.k_multiple = 16;
      kernel.n_multiple = kernel.tensor_maps ? 8 : 16;
    }
    if (kernel.tensor_maps && !state->trans_b)
      return failed("kernel " + image->kernel + " takes weights stored [G, N, K] only (layout nk)");
    if (kernel.tensor_maps && (image->block_m != kWgmmaMaxWidth || image->block_n != kWgmmaTileFeatures))
      return failed("kernel " + image->kernel + " has tiles " + std::to_string(image->block_m) + "x" +
                    std::to_string(image->block_n) + "; this launcher drives 256x128 (rebuild both from one release)");

    LoadedImage module;
    std::string message;
    if (!load_image(cu, *ref, device, &module, &message)) return failed(message);
    kernel.module = module.module;
    kernel.function = module.function;
    state->kernels.push_back(kernel);
    LoadedKernel& loaded = state->kernels.back();
    const int per_sm = module.blocks_per_sm;
    // Persistent kernels loop over tiles: one CTA per resident slot is enough.
    loaded.max_grid = image->persistent ? sms * per_sm : 0;
    loaded.sms = sms;
    cu.cuFuncGetAttribute(&loaded.cluster, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, loaded.function);
    loaded.cluster = std::max(loaded.cluster, 1);
    if (loaded.cluster > 1) {
      if (!loaded.tensor_maps || loaded.cluster > 2 || !image->persistent)
        return failed("kernel " + image->kernel + " asks for clusters of " + std::to_string(loaded.cluster) +
                      " CTAs; this launcher drives clusters only for the wgmma kernel, of 1 or 2");
      // Multiprocessors pair up within a GPC only: ask how many clusters fit at once.
      CUlaunchConfig config = {};
      config.gridDimX = static_cast<unsigned>(loaded.max_grid);
      config.gridDimY = config.gridDimZ = config.blockDimY = config.blockDimZ = 1;
      config.blockDimX = static_cast<unsigned>(loaded.threads);
      config.sharedMemBytes = static_cast<unsigned>(image->shared_bytes);
      int clusters = 0;
      status = cu.cuOccupancyMaxActiveClusters(&clusters, loaded.function, &config);
      if (status != CUDA_SUCCESS || clusters < 1)
        return failed("kernel " + image->kernel + " cannot run clusters of " + std::to_string(loaded.cluster) +
                      " CTAs on " + gpu + ": " + (status != CUDA_SUCCESS ? cu.describe(status) : "none fit"));
      loaded.max_grid = clusters * loaded.cluster;
    }
    if (!image->persistent && (image->global_scratch_bytes > 0 || image->profile_scratch_bytes > 0))
      return failed("kernel " + image->kernel + " needs scratch memory but is not persistent; its grid is unbounded");
    loaded.scratch_stride = round_up(static_cast<size_t>(image->global_scratch_bytes),
                                     static_cast<size_t>(std::max(image->global_scratch_align, 1)));
    loaded.profile_stride = round_up(static_cast<size_t>(image->profile_scratch_bytes), 256);
    size_t need = round_up(loaded.scratch_stride * loaded.max_grid, 256) + loaded.profile_stride * loaded.max_grid;
    state->workspace_bytes = std::max(state->workspace_bytes, need);
  }
  // The row quantizations leave the GEMMs' list, in the order they are tried: "quantize_rows_whole" (few
  // elements, K % 16 == 0, K <= its block), "quantize_rows" (K % 16 == 0), "quantize_rows_any"; the
  // "quantize_rows_swiglu" ones the same, for launches whose a is a gate+up output.
  for (const std::string form : {"quantize_rows", "quantize_rows_swiglu"}) {
    for (const char* blocking : {"_whole", "", "_any"}) {
      const std::string variant = form + blocking;
      auto quantize = std::find_if(state->kernels.begin(), state->kernels.end(),
                                   [&](const LoadedKernel& k) { return k.variant == variant; });
      if (quantize == state->kernels.end()) continue;
      if (quantize->max_grid > 0)
        return failed("kernel " + quantize->name + " is persistent; the row quantization runs one CTA per block_m rows");
      (form == "quantize_rows" ? state->quantize : state->swiglu_quantize).push_back(*quantize);
      state->kernels.erase(quantize);
    }
  }
  // The FP8 MoE GEMMs read their activations quantized already (Fp8Operands::a_block_scale, a_token_scale): no
  // row quantization.
  if (state->fp8 && moe == MoEGemm::kNone &&
      (state->quantize.empty() || state->quantize.back().variant != "quantize_rows_any"))
    return failed("the fp8 images have no \"quantize_rows_any\" image serving " + gpu +
                  " (the activations' row quantization for any K); images offered: " + offered +
                  ". Export them together (aot.grouped_mm_images(..., weight_format=\"fp8\"))");
  if (state->kernels.empty())
    return failed("no grouped GEMM image serves " + gpu + " beside the row quantization; images offered: " + offered);
  for (const char* required : {"any", "gemv_any"}) {
    if (state->int4 && std::none_of(state->kernels.begin(), state->kernels.end(),
                                    [&](const LoadedKernel& k) { return k.variant == required; }))
      return failed(std::string("the int4 images have no \"") + required + "\" image serving " + gpu +
                    " (it takes any K and N); images offered: " + offered +
                    ". Export them together (aot.grouped_mm_images(..., weight_format=\"int4\"))");
  }
  std::stable_sort(state->kernels.begin(), state->kernels.end(), [](const LoadedKernel& x, const LoadedKernel& y) {
    return variant_rank(x.variant) < variant_rank(y.variant);
  });
  if (state->workspace_bytes > 0) {
    status = cu.cuMemAlloc(&state->workspace, state->workspace_bytes);
    if (status != CUDA_SUCCESS)
      return failed("cannot allocate " + std::to_string(state->workspace_bytes) + " bytes of kernel scratch: " +
                    cu.describe(status));
  }
  return std::unique_ptr<GroupedMMLauncher>(new GroupedMMLauncher(std::move(state)));
}

size_t GroupedMMLauncher::fp8_workspace_bytes(int64_t rows, int64_t k) {
  if (rows <= 0) return 0;
  return round_up(static_cast<size_t>(rows) * static_cast<size_t>(std::max<int64_t>(k, 0)), 256) +
         4 * static_cast<size_t>(rows);
}

bool GroupedMMLauncher::launch(const void* a, const void* b, const int32_t* offs, void* out, int64_t rows, int64_t k,
                               int64_t n, int64_t groups, bool trans_b, CUstream stream, std::string* error,
                               const Fp8Operands* fp8, const MoEEpilogue* moe, const Int4Operands* int4) {
  const CudaDriver& cu = *state_->cu;
  const std::string shape = "(rows " + std::to_string(rows) + ", K " + std::to_string(k) + ", N " + std::to_string(n) +
                            ", groups " + std::to_string(groups) + ")";
  if (rows < 0 || k < 0 || n < 0 || groups < 0) return fail(error, "grouped_mm: negative size " + shape);
  // The kernels index rows, columns and one expert's weights with 32-bit integers,
  // plus up to one tile (< 1024) past the end.
  constexpr int64_t kIndexLimit = (int64_t{1} << 31) - 1024;
  if (rows >= kIndexLimit || k >= kIndexLimit || n >= kIndexLimit || groups >= kIndexLimit || k * n >= kIndexLimit)
    return fail(error, "grouped_mm: sizes " + shape + " exceed the kernel's 32-bit indexing (rows, K, N and K*N must be"
                       " below 2^31 - 1024); split the call");
  if (trans_b != state_->trans_b)
    return fail(error, std::string("grouped_mm: called with trans_b=") + (trans_b ? "true" : "false") +
                           " but the kernel images are for trans_b=" + (state_->trans_b ? "true" : "false") +
                           "; compile images for this layout");
  if (state_->fp8 && fp8 == nullptr)
    return fail(error, "grouped_mm: the kernel images take fp8 weights; pass b as float8 e4m3 [G, N, K] with its "
                       "Fp8Operands (b_scale and a workspace of fp8_workspace_bytes(rows, k) bytes)");
  if (!state_->fp8 && fp8 != nullptr)
    return fail(error, "grouped_mm: fp8 operands were given but the kernel images take dense weights; load the fp8 "
                       "images (weight_format \"fp8\") for fp8 weights");
  if (state_->int4 != (int4 != nullptr))
    return fail(error, state_->int4 ? "grouped_mm: the kernel images take int4 weights; pass b packed [G, N, K] with "
                                      "its Int4Operands (b_scale and group_size)"
                                    : "grouped_mm: int4 operands were given but the kernel images do not take int4 "
                                      "weights; load the int4 images (weight_format \"int4\") for int4 weights");
  if ((state_->moe != MoEGemm::kNone) != (moe != nullptr))
    return fail(error, "grouped_mm: a MoE epilogue is given iff the launcher runs a MoE experts GEMM " + shape);
  if (moe && (k == 0 || groups == 0)) return fail(error, "grouped_mm: a MoE experts GEMM needs K and groups " + shape);
  if (rows == 0 || n == 0) return true;
  if (out == nullptr) return fail(error, "grouped_mm: null output pointer " + shape);
  if (k == 0 || groups == 0) {  // no products (a, b, offs may be empty): every row is zero
    CUresult status = cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(out), 0, static_cast<size_t>(rows * n * 2), stream);
    if (status != CUDA_SUCCESS) return fail(error, "grouped_mm: zero fill failed: " + cu.describe(status));
    state_->last_kernel = "memset";
    state_->last_quantize.clear();
    return true;
  }
  if (a == nullptr || b == nullptr || offs == nullptr)
    return fail(error, "grouped_mm: null pointer among a, b, offs " + shape);
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(a) || misaligned(b) || misaligned(offs) || misaligned(out))
    return fail(error, "grouped_mm: a, b, offs and out must be 16-byte aligned device pointers");
  if (int4 && (int4->b_scale == nullptr || misaligned(int4->b_scale)))
    return fail(error, "grouped_mm: int4 weights need b_scale, bfloat16 [G, N, ceil(K / group_size)] in a 16-byte "
                       "aligned device buffer");
  if (int4 && int4->group_size != 32 && int4->group_size != 64 && int4->group_size != 128)
    return fail(error, "grouped_mm: int4 group_size must be 32, 64 or 128; got " + std::to_string(int4->group_size));
  // The FP8 MoE down: a is quantized already, with its block scales; the FP8 MoE gate+up: with its tokens' scales.
  const bool block_scaled = fp8 != nullptr && fp8->a_block_scale != nullptr;
  const bool token_scaled = fp8 != nullptr && fp8->a_token_scale != nullptr;
  if (fp8 && (state_->moe == MoEGemm::kDown) != block_scaled)
    return fail(error, "grouped_mm: the fp8 MoE down takes its activations quantized (Fp8Operands::a_block_scale), "
                       "and only it " + shape);
  if (fp8 && (state_->moe == MoEGemm::kGateUp) != token_scaled)
    return fail(error, "grouped_mm: the fp8 MoE gate+up takes its activations quantized (Fp8Operands::"
                       "a_token_scale), and only it " + shape);
  if (block_scaled) {
    if (fp8->b_scale == nullptr || misaligned(fp8->b_scale) || misaligned(fp8->a_block_scale))
      return fail(error, "grouped_mm: the fp8 MoE down needs b_scale [G, N] and a_block_scale [rows, ceil(K / 128)], "
                         "float32 in 16-byte aligned device buffers");
  } else if (token_scaled) {
    if (fp8->b_scale == nullptr || misaligned(fp8->b_scale) || misaligned(fp8->a_token_scale))
      return fail(error, "grouped_mm: the fp8 MoE gate+up needs b_scale [G, N] and a_token_scale [tokens], float32 "
                         "in 16-byte aligned device buffers");
    if (moe->sorted == nullptr || moe->top_k <= 0 || moe->out_scale == nullptr || misaligned(moe->out_scale) ||
        n % 16 != 0)
      return fail(error, "grouped_mm: the fp8 MoE gate+up needs the pairs (MoEEpilogue::sorted), top_k > 0, "
                         "out_scale float32 [rows, ceil(N / 256)] in a 16-byte aligned device buffer and N % 16 == 0 " +
                         shape);
  } else if (fp8) {
    if (fp8->swiglu && (state_->swiglu_quantize.empty() ||
                        state_->swiglu_quantize.back().variant != "quantize_rows_swiglu_any"))
      return fail(error, "grouped_mm: a launch with a gate+up output as a (Fp8Operands::swiglu) needs the "
                         "\"quantize_rows_swiglu\" images, and the loaded fp8 images have no "
                         "\"quantize_rows_swiglu_any\"; re-export with this release");
    if (fp8->swiglu && 2 * k >= kIndexLimit)
      return fail(error, "grouped_mm: a gate+up output of 2K = " + std::to_string(2 * k) +
                             " columns exceeds the kernels' 32-bit indexing " + shape + "; split the call");
    if (fp8->b_scale == nullptr || misaligned(fp8->b_scale))
      return fail(error, "grouped_mm: fp8 weights need b_scale, float32 [G, N] in a 16-byte aligned device buffer");
    const size_t need = fp8_workspace_bytes(rows, k);
    if (fp8->workspace == nullptr || fp8->workspace_bytes < need)
      return fail(error, "grouped_mm: fp8 weights need a workspace of fp8_workspace_bytes(rows, k) = " +
                             std::to_string(need) + " bytes " + shape + "; got " +
                             (fp8->workspace ? std::to_string(fp8->workspace_bytes) : std::string("none")));
    if ((reinterpret_cast<uintptr_t>(fp8->workspace) & 255) != 0)
      return fail(error, "grouped_mm: the fp8 workspace must be 256-byte aligned");
  }

  // Upper bound on output tiles: every non-empty group adds at most one partial
  // row block, and the tail group one more. A cluster's tile spans `cluster` column blocks.
  auto max_tiles = [&](const LoadedKernel& kernel, int cluster) {
    int64_t row_blocks = std::min<int64_t>((rows + kernel.block_m - 1) / kernel.block_m + std::min(groups, rows) + 1, rows);
    const int64_t columns = int64_t{kernel.block_n} * cluster;
    return row_blocks * ((n + columns - 1) / columns);
  };
  const LoadedKernel* kernel = nullptr;
  const LoadedKernel* small = nullptr;
  // INT4: the vector-matrix kernel for about one row per group, else the tensor-core tiles.
  const bool gemv = int4 && rows <= std::max(groups, kInt4GemvMaxRows);
  for (const auto& candidate : state_->kernels) {
    if (k % candidate.k_multiple != 0 || n % candidate.n_multiple != 0) continue;
    if (int4 && (candidate.variant.rfind("gemv", 0) == 0) != gemv) continue;
    if (candidate.tensor_maps && groups > kWgmmaMaxGroups) continue;
    if (candidate.variant == "tma_small") {
      if (!small) small = &candidate;
    } else if (!kernel) {
      kernel = &candidate;
    }
  }
  // Few rows per group, or large tiles that leave multiprocessors idle: more, smaller tiles win.
  const bool large_tiles = kernel && (kernel->variant == "wgmma" || kernel->variant == "tma");
  if (small && (!large_tiles || rows < 64 * groups || max_tiles(*kernel, 1) < kernel->sms))
    kernel = small;
  if (kernel == nullptr) {
    std::string loaded;
    for (const auto& candidate : state_->kernels) loaded += " " + candidate.name;
    return fail(error, "grouped_mm: no loaded kernel takes K " + std::to_string(k) + " and N " + std::to_string(n) +
                           " (loaded:" + loaded + "); include the 'any' variant in the images");
  }
  const int64_t ctas = max_tiles(*kernel, kernel->cluster) * kernel->cluster;
  unsigned grid = static_cast<unsigned>(kernel->max_grid > 0 ? std::min<int64_t>(ctas, kernel->max_grid)
                                                             : std::min<int64_t>(ctas, 0x7fffffff));

  CUdeviceptr a_arg = reinterpret_cast<CUdeviceptr>(a), b_arg = reinterpret_cast<CUdeviceptr>(b);
  CUdeviceptr offs_arg = reinterpret_cast<CUdeviceptr>(offs), out_arg = reinterpret_cast<CUdeviceptr>(out);
  int32_t rows_arg = static_cast<int32_t>(rows), k_arg = static_cast<int32_t>(k), n_arg = static_cast<int32_t>(n);
  int32_t groups_arg = static_cast<int32_t>(groups);
  CUdeviceptr base = state_->workspace;
  CUdeviceptr scratch_arg = kernel->scratch_stride ? base : 0;
  CUdeviceptr profile_arg = kernel->profile_stride ? base + round_up(kernel->scratch_stride * kernel->max_grid, 256) : 0;
  CUdeviceptr a_scale_arg = 0, b_scale_arg = 0;
  const LoadedKernel* quantized_by = nullptr;
  if (block_scaled || token_scaled) {  // a and its scales as given
    a_scale_arg = reinterpret_cast<CUdeviceptr>(block_scaled ? fp8->a_block_scale : fp8->a_token_scale);
    b_scale_arg = reinterpret_cast<CUdeviceptr>(fp8->b_scale);
  } else if (fp8) {
    // The activations' row quantization into the workspace first, on the same stream: (a, a_q, a_scale,
    // rows, K, global scratch, profile scratch), one CTA per block_m rows. With swiglu, a is [rows, 2K] and
    // the rows quantized are its SwiGLU (K is the GEMM's).
    const CUdeviceptr a_q = reinterpret_cast<CUdeviceptr>(fp8->workspace);
    a_scale_arg = a_q + round_up(static_cast<size_t>(rows * k), 256);
    b_scale_arg = reinterpret_cast<CUdeviceptr>(fp8->b_scale);
    CUdeviceptr a_q_arg = a_q, no_scratch = 0;
    void* quantize_args[] = {&a_arg, &a_q_arg, &a_scale_arg, &rows_arg, &k_arg, &no_scratch, &no_scratch};
    const std::vector<LoadedKernel>& quantizations = fp8->swiglu ? state_->swiglu_quantize : state_->quantize;
    const LoadedKernel& quantize = *std::find_if(
        quantizations.begin(), quantizations.end(), [&](const LoadedKernel& q) {  // "_any" takes any K
          return k % q.k_multiple == 0 && (q.max_k == 0 || k <= q.max_k) &&
                 (q.max_elements == 0 || rows * k <= q.max_elements);
        });
    quantized_by = &quantize;
    const int64_t blocks = (rows + quantize.block_m - 1) / quantize.block_m;
    CUresult status = cu.cuLaunchKernel(quantize.function, static_cast<unsigned>(blocks), 1, 1,
                                        static_cast<unsigned>(quantize.threads), 1, 1,
                                        static_cast<unsigned>(quantize.shared_bytes), stream, quantize_args, nullptr);
    if (status != CUDA_SUCCESS)
      return fail(error, "grouped_mm: launching " + quantize.name + " " + shape + " failed: " + cu.describe(status));
    a_arg = a_q;  // the GEMM reads the quantized rows
    a = fp8->workspace;
  }
  // Triton's signature (grouped_mm.py): the user arguments, then the global and profile scratch pointers;
  // with fp8 weights a_scale and b_scale follow G (dense images compile them away).
  void* triton_args[] = {&a_arg,    &b_arg,     &offs_arg,    &out_arg,    &rows_arg,
                         &k_arg,    &n_arg,     &groups_arg,  &scratch_arg, &profile_arg};
  void* triton_fp8_args[] = {&a_arg, &b_arg, &offs_arg,   &out_arg,     &rows_arg,    &k_arg,
                             &n_arg, &groups_arg, &a_scale_arg, &b_scale_arg, &scratch_arg, &profile_arg};
  // With int4 weights the weight scales and the group size follow G (the gemv and tile kernels alike).
  CUdeviceptr int4_scale_arg = int4 ? reinterpret_cast<CUdeviceptr>(int4->b_scale) : 0;
  int32_t group_size_arg = int4 ? static_cast<int32_t>(int4->group_size) : 0;
  void* triton_int4_args[] = {&a_arg,      &b_arg,          &offs_arg,       &out_arg,     &rows_arg,   &k_arg,
                              &n_arg,      &groups_arg,     &int4_scale_arg, &group_size_arg, &scratch_arg,
                              &profile_arg};
  WgmmaMaps* maps = nullptr;
  if (kernel->tensor_maps) {
    for (auto& cached : state_->wgmma_maps)
      if (cached.encoded_for(kernel, a, b, rows, k, n, groups)) {
        maps = &cached;
        break;
      }
    if (maps == nullptr) {
      WgmmaMaps& slot = state_->wgmma_maps[state_->next_maps_slot++ % state_->wgmma_maps.size()];
      const CUtensorMapDataType type = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                       : state_->dtype == blob::DType::BFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      CUresult encoded = slot.encode(cu, type, kernel, a, b, rows, k, n, groups);
      if (encoded != CUDA_SUCCESS)
        return fail(error, "grouped_mm: cannot describe a and b for TMA " + shape + ": " + cu.describe(encoded));
      maps = &slot;
    }
  }
  // cuLaunchKernel copies the parameters: the descriptors may be replaced after it returns.
  void* map_args[] = {maps ? &maps->a_maps : nullptr, maps ? &maps->b_map : nullptr, &offs_arg, &out_arg,
                      &rows_arg, &k_arg, &n_arg, &groups_arg};
  void* map_fp8_args[] = {maps ? &maps->a_maps : nullptr, maps ? &maps->b_map : nullptr, &offs_arg, &out_arg,
                          &a_scale_arg, &b_scale_arg, &rows_arg, &k_arg, &n_arg, &groups_arg};
  static_assert(sizeof(MoEEpilogue) == 56, "grouped_mm_sm90.cu's MoEEpilogue, passed by value");
  MoEEpilogue moe_arg = moe ? *moe : MoEEpilogue{};
  void* map_moe_args[] = {maps ? &maps->a_maps : nullptr, maps ? &maps->b_map : nullptr, &offs_arg, &out_arg,
                          &moe_arg, &rows_arg, &k_arg, &n_arg, &groups_arg};
  void* map_fp8_moe_args[] = {maps ? &maps->a_maps : nullptr, maps ? &maps->b_map : nullptr, &offs_arg, &out_arg,
                              &a_scale_arg, &b_scale_arg, &moe_arg, &rows_arg, &k_arg, &n_arg, &groups_arg};
  void** args = kernel->tensor_maps
                    ? (fp8 && moe ? map_fp8_moe_args : fp8 ? map_fp8_args : moe ? map_moe_args : map_args)
                    : (fp8 ? triton_fp8_args : int4 ? triton_int4_args : triton_args);
  // An image that waits for the grid before it (the fp8 GEMMs from sm_90) starts while the row quantization runs:
  // its launch and setup overlap the quantization's tail. Before it waits, the GEMM reads offs at most (the wgmma
  // kernel's group table): work before the quantization wrote it, and the quantization started only once that work
  // had finished. An image that does not say so (an older export's) starts after it.
  const bool overlap = kernel->waits_for_prior_grid && quantized_by != nullptr;
  CUresult status = cu.launch(kernel->function, grid, 1, static_cast<unsigned>(kernel->threads),
                              static_cast<unsigned>(kernel->shared_bytes), stream, args, overlap);
  if (status != CUDA_SUCCESS)
    return fail(error, "grouped_mm: launching " + kernel->name + " " + shape + " failed: " + cu.describe(status));
  state_->last_kernel = kernel->name;
  state_->last_quantize = quantized_by ? quantized_by->name : "";
  return true;
}

const std::string& GroupedMMLauncher::last_kernel() const { return state_->last_kernel; }
const std::string& GroupedMMLauncher::last_quantize() const { return state_->last_quantize; }

}  // namespace et_trt::kernels
