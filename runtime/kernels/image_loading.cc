#include "image_loading.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace et_trt::kernels {
namespace {

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

// "sm_90a" -> {90, true}; {-1, false} when malformed.
std::pair<int, bool> parse_arch(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return {-1, false};
  std::string digits = arch.substr(3);
  bool specific = !digits.empty() && digits.back() == 'a';
  if (specific) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {-1, false};
  return {std::atoi(digits.c_str()), specific};
}

// Whether an image made for `arch` runs on a device of compute capability `cc`
// (major * 10 + minor): "a" targets only on their own; cubins on the same major
// with an equal or higher minor; PTX (JIT) on any equal or newer device.
bool serves(const blob::KernelImageT& image, int cc) {
  auto [cap, specific] = parse_arch(image.arch);
  if (cap < 0) return false;
  if (specific) return cap == cc;
  if (image.format == blob::ImageFormat::Cubin) return cap / 10 == cc / 10 && cap <= cc;
  return cap <= cc;
}

}  // namespace

bool is_moe_experts_image(const blob::KernelImageT& image) { return image.kernel.rfind("moe_", 0) == 0; }

const char* kernel_dtype_name(blob::DType dtype) {
  return dtype == blob::DType::BFloat16 ? "bf16" : dtype == blob::DType::Float16 ? "fp16" : nullptr;
}

bool current_gpu(const CudaDriver& cu, Gpu* gpu, std::string* error) {
  CUresult status = cu.cuCtxGetCurrent(&gpu->context);
  if (status != CUDA_SUCCESS || gpu->context == nullptr)
    return fail(error, "no current CUDA context on this thread; initialize CUDA (e.g. cudaSetDevice/cudaFree(0)) first");
  CUdevice device = 0;
  cu.cuCtxGetDevice(&device);
  int major = 0, minor = 0;
  cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  cu.cuDeviceGetAttribute(&gpu->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  cu.cuDeviceGetAttribute(&gpu->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
  cu.cuDriverGetVersion(&gpu->driver_version);
  char name[256] = {0};
  cu.cuDeviceGetName(name, sizeof(name) - 1, device);
  gpu->cc = major * 10 + minor;
  gpu->name = std::string(name) + " (sm_" + std::to_string(gpu->cc) + ")";
  return true;
}

std::vector<const KernelImageRef*> choose_images(const std::vector<KernelImageRef>& images, int cc,
                                                 const std::function<std::string(const blob::KernelImageT&)>& key,
                                                 std::string* offered) {
  std::vector<const KernelImageRef*> chosen;
  for (const KernelImageRef& ref : images) {
    const blob::KernelImageT& image = *ref.fields;
    *offered += (offered->empty() ? "" : ", ") + image.kernel + "@" + image.arch +
                (image.format == blob::ImageFormat::Ptx ? "(ptx)" : "");
    if (!serves(image, cc)) continue;
    auto same = std::find_if(chosen.begin(), chosen.end(),
                             [&](const KernelImageRef* c) { return key(*c->fields) == key(image); });
    if (same == chosen.end()) {
      chosen.push_back(&ref);
      continue;
    }
    const blob::KernelImageT& current = *(*same)->fields;
    bool better = (image.format == blob::ImageFormat::Cubin && current.format == blob::ImageFormat::Ptx) ||
                  (image.format == current.format && parse_arch(image.arch).first > parse_arch(current.arch).first);
    if (better) *same = &ref;
  }
  return chosen;
}

std::vector<const KernelImageRef*> images_for_gpu(const std::vector<KernelImageRef>& images, int cc) {
  std::string offered;
  return choose_images(images, cc, [](const blob::KernelImageT& image) {
    return image.variant + "/" + std::to_string(static_cast<int>(image.dtype)) + "/" + (image.trans_b ? "t" : "n") +
           "/" + std::to_string(static_cast<int>(image.weight_format));
  }, &offered);
}

bool load_image(const CudaDriver& cu, const KernelImageRef& ref, const Gpu& gpu, LoadedImage* loaded,
                std::string* error) {
  const blob::KernelImageT& image = *ref.fields;
  if (image.shared_bytes > gpu.smem_optin)
    return fail(error, "kernel " + image.kernel + " needs " + std::to_string(image.shared_bytes) +
                           " bytes of shared memory per block; " + gpu.name + " allows " +
                           std::to_string(gpu.smem_optin) +
                           ". Compile it for this architecture (smaller tiles or fewer stages)");
  // PTX must be NUL-terminated for the driver's JIT.
  std::string ptx;
  const void* data = ref.bytes;
  if (image.format == blob::ImageFormat::Ptx) {
    ptx.assign(reinterpret_cast<const char*>(ref.bytes), ref.size);
    data = ptx.c_str();
  }
  char jit_log[4096] = {0};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {jit_log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(jit_log) - 1))};
  CUresult status = cu.cuModuleLoadDataEx(&loaded->module, data, 2, options, values);
  if (status == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    return fail(error, "the CUDA driver (version " + std::to_string(gpu.driver_version) +
                           ") is too old for the PTX of " + image.kernel + " (PTX ISA " + image.ptx_version +
                           "); update the driver or ship a cubin for " + gpu.name);
  if (status != CUDA_SUCCESS)
    return fail(error, "cannot load " + image.kernel + " (" + image.arch + ") on " + gpu.name + ": " +
                           cu.describe(status) + (jit_log[0] ? std::string("; JIT log: ") + jit_log : std::string()));
  auto failed = [&](std::string message) {
    cu.cuModuleUnload(loaded->module);
    loaded->module = nullptr;
    return fail(error, std::move(message));
  };
  status = cu.cuModuleGetFunction(&loaded->function, loaded->module, image.entry.c_str());
  if (status != CUDA_SUCCESS)
    return failed("image " + image.kernel + " has no entry '" + image.entry + "': " + cu.describe(status));
  loaded->threads = image.num_warps * 32;
  int max_threads = 0;
  cu.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, loaded->function);
  cu.cuFuncGetAttribute(&loaded->registers, CU_FUNC_ATTRIBUTE_NUM_REGS, loaded->function);
  if (max_threads < loaded->threads)
    return failed("kernel " + image.kernel + " uses " + std::to_string(loaded->registers) + " registers per thread, so " +
                  gpu.name + " runs at most " + std::to_string(max_threads) + " threads per block, fewer than its " +
                  std::to_string(loaded->threads) + "; compile it with fewer warps or smaller tiles");
  if (image.shared_bytes > 48 * 1024) {
    status = cu.cuFuncSetAttribute(loaded->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   image.shared_bytes);
    if (status != CUDA_SUCCESS)
      return failed("cannot opt in to " + std::to_string(image.shared_bytes) + " bytes of shared memory for " +
                    image.kernel + ": " + cu.describe(status));
  }
  status = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&loaded->blocks_per_sm, loaded->function, loaded->threads,
                                                          image.shared_bytes);
  if (status != CUDA_SUCCESS || loaded->blocks_per_sm < 1)
    return failed("kernel " + image.kernel + " cannot be resident on " + gpu.name + " (" +
                  std::to_string(loaded->registers) + " registers, " + std::to_string(image.shared_bytes) +
                  " bytes of shared memory per block)");
  return true;
}

}  // namespace et_trt::kernels
