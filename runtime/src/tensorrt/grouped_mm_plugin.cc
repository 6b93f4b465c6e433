#include "grouped_mm_plugin.h"

#include <executorch/runtime/platform/log.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "grouped_mm_launcher.h"
#include "kernel_images.h"
#include "log.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

constexpr char kTransBField[] = "trans_b";
constexpr char kKernelImagesField[] = "kernel_images";

thread_local const std::vector<uint8_t>* parsing_pack = nullptr;

// Immutable kernel images shared by a plugin and its clones (8-byte aligned
// for the flatbuffers reader).
struct KernelPack {
  std::vector<uint64_t> storage;
  size_t size = 0;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage.data()); }

  static std::shared_ptr<const KernelPack> copy(const void* bytes, size_t size) {
    auto pack = std::make_shared<KernelPack>();
    pack->storage.resize(size / 8 + 1);
    pack->size = size;
    std::memcpy(pack->storage.data(), bytes, size);
    return pack;
  }
};

const char* dtype_of(DataType type) {
  return type == DataType::kBF16 ? "bf16" : type == DataType::kHALF ? "fp16" : nullptr;
}

class GroupedMMPlugin final : public nvinfer1::IPluginV3,
                              public nvinfer1::IPluginV3OneCore,
                              public nvinfer1::IPluginV3OneBuild,
                              public nvinfer1::IPluginV3OneRuntime {
 public:
  GroupedMMPlugin(bool trans_b, std::shared_ptr<const KernelPack> pack)
      : trans_b_(trans_b ? 1 : 0), pack_(std::move(pack)) {
    // Offer TensorRT only the dtypes there are images for (a weakly typed
    // build may otherwise pick one the plugin cannot run).
    std::string error;
    if (const blob::Blob* images = unpack_kernel_images(pack_->data(), pack_->size, &error)) {
      has_bf16_ = !kernel_image_views(*images, "bf16", trans_b).empty();
      has_fp16_ = !kernel_image_views(*images, "fp16", trans_b).empty();
    }
  }

  // ---- IPluginV3 ----
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }

  // A clone shares the images and makes its own launcher: one per execution
  // context, so launches on different contexts never share scratch memory.
  nvinfer1::IPluginV3* clone() noexcept override { return new (std::nothrow) GroupedMMPlugin(trans_b_ != 0, pack_); }

  // ---- IPluginV3OneCore ----
  const char* getPluginName() const noexcept override { return kGroupedMMName; }
  const char* getPluginVersion() const noexcept override { return kGroupedMMVersion; }
  const char* getPluginNamespace() const noexcept override { return kGroupedMMNamespace; }

  // ---- IPluginV3OneBuild ----
  int32_t getNbOutputs() const noexcept override { return 1; }

  int32_t getOutputDataTypes(DataType* outputs, int32_t nb_outputs, const DataType* inputs,
                             int32_t nb_inputs) const noexcept override {
    if (nb_inputs != 3 || nb_outputs != 1) return -1;
    outputs[0] = inputs[0];
    return 0;
  }

  int32_t getOutputShapes(const DimsExprs* inputs, int32_t nb_inputs, const DimsExprs*, int32_t, DimsExprs* outputs,
                          int32_t nb_outputs, nvinfer1::IExprBuilder&) noexcept override {
    if (nb_inputs != 3 || nb_outputs != 1 || inputs[0].nbDims != 2 || inputs[1].nbDims != 3) {
      ET_LOG(Error, "GroupedMM: expects a [rows, K], b [G, K, N] or [G, N, K], offs [G]");
      return -1;
    }
    outputs[0].nbDims = 2;
    outputs[0].d[0] = inputs[0].d[0];  // rows: dynamic, whatever a has
    outputs[0].d[1] = inputs[1].d[trans_b_ ? 1 : 2];
    return 0;
  }

  bool supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* io, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override {
    if (nb_inputs != 3 || nb_outputs != 1 || pos < 0 || pos > 3) return false;
    const PluginTensorDesc& desc = io[pos].desc;
    if (desc.format != TensorFormat::kLINEAR) return false;
    if (pos == 2) return desc.type == DataType::kINT32;
    if (pos == 0) return (desc.type == DataType::kBF16 && has_bf16_) || (desc.type == DataType::kHALF && has_fp16_);
    return desc.type == io[0].desc.type;  // b and out in a's dtype
  }

  int32_t configurePlugin(const DynamicPluginTensorDesc*, int32_t nb_inputs, const DynamicPluginTensorDesc*,
                          int32_t nb_outputs) noexcept override {
    return nb_inputs == 3 && nb_outputs == 1 ? 0 : -1;
  }

  // ---- IPluginV3OneRuntime ----
  int32_t onShapeChange(const PluginTensorDesc* in, int32_t nb_inputs, const PluginTensorDesc*,
                        int32_t nb_outputs) noexcept override {
    if (nb_inputs != 3 || nb_outputs != 1) return -1;
    const nvinfer1::Dims &a = in[0].dims, &b = in[1].dims, &offs = in[2].dims;
    const int64_t k = b.d[trans_b_ ? 2 : 1];
    if (a.nbDims != 2 || b.nbDims != 3 || offs.nbDims != 1 || a.d[1] != k || offs.d[0] != b.d[0]) {
      ET_LOG(Error, "GroupedMM: inconsistent shapes a[%lld, %lld], b[%lld, %lld, %lld], offs[%lld] (trans_b=%d)",
             (long long)a.d[0], (long long)a.d[1], (long long)b.d[0], (long long)b.d[1], (long long)b.d[2],
             (long long)offs.d[0], trans_b_);
      return -1;
    }
    return 0;
  }

  int32_t enqueue(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                  void* const* outputs, void*, cudaStream_t stream) noexcept override {
    std::string error;
    if (launcher_ == nullptr && !create_launcher(in[0].type, &error)) {
      log_error("GroupedMM: " + error);
      return -1;
    }
    const nvinfer1::Dims &a = in[0].dims, &b = in[1].dims;
    const int64_t rows = a.d[0], k = a.d[1], n = b.d[trans_b_ ? 1 : 2], groups = b.d[0];
    if (!launcher_->launch(inputs[0], inputs[1], static_cast<const int32_t*>(inputs[2]), outputs[0], rows, k, n,
                           groups, trans_b_ != 0, reinterpret_cast<CUstream>(stream), &error)) {
      log_error("GroupedMM: " + error);
      return -1;
    }
    return 0;
  }

  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }

  const PluginFieldCollection* getFieldsToSerialize() noexcept override {
    fields_[0] = PluginField(kTransBField, &trans_b_, PluginFieldType::kINT32, 1);
    fields_[1] = PluginField(kKernelImagesField, pack_->data(), PluginFieldType::kUNKNOWN,
                             static_cast<int32_t>(pack_->size));
    collection_.nbFields = 2;
    collection_.fields = fields_;
    return &collection_;
  }

 private:
  bool create_launcher(DataType type, std::string* error) {
    const char* dtype = dtype_of(type);
    if (dtype == nullptr) {
      *error = "a must be bf16 or fp16";
      return false;
    }
    const blob::Blob* images = unpack_kernel_images(pack_->data(), pack_->size, error);
    if (images == nullptr) return false;
    const auto views = kernel_image_views(*images, dtype, trans_b_ != 0);
    if (views.empty()) {
      *error = std::string("the engine carries no ") + dtype + " kernel image for trans_b=" +
               std::to_string(trans_b_) + "; re-export with grouped_gemm_kernel on and this dtype";
      return false;
    }
    launcher_ = kernels::GroupedMMLauncher::create(views, error);
    return launcher_ != nullptr;
  }

  int32_t trans_b_;
  std::shared_ptr<const KernelPack> pack_;
  bool has_bf16_ = false, has_fp16_ = false;
  std::unique_ptr<kernels::GroupedMMLauncher> launcher_;
  PluginField fields_[2];
  PluginFieldCollection collection_{};
};

class GroupedMMCreator final : public nvinfer1::IPluginCreatorV3One {
 public:
  GroupedMMCreator() {
    field_names_[0] = PluginField(kTransBField, nullptr, PluginFieldType::kINT32, 1);
    field_names_[1] = PluginField(kKernelImagesField, nullptr, PluginFieldType::kUNKNOWN, 0);
    collection_.nbFields = 2;
    collection_.fields = field_names_;
  }

  nvinfer1::IPluginV3* createPlugin(const char*, const PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override {
    bool trans_b = false;
    std::shared_ptr<const KernelPack> pack;
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
      const PluginField& f = fc->fields[i];
      if (f.name == nullptr || f.data == nullptr) continue;
      if (std::strcmp(f.name, kTransBField) == 0 && f.length >= 1) {
        if (f.type == PluginFieldType::kINT32) trans_b = *static_cast<const int32_t*>(f.data) != 0;
        else if (f.type == PluginFieldType::kINT64) trans_b = *static_cast<const int64_t*>(f.data) != 0;
      } else if (std::strcmp(f.name, kKernelImagesField) == 0 && f.length > 0) {
        pack = KernelPack::copy(f.data, static_cast<size_t>(f.length));
      }
    }
    if (pack == nullptr && parsing_pack != nullptr && !parsing_pack->empty()) {
      pack = KernelPack::copy(parsing_pack->data(), parsing_pack->size());
    }
    if (pack == nullptr) {
      ET_LOG(Error, "GroupedMM plugin (%s): no kernel images: it is only created by et-trt's engine builder, "
                    "which supplies the blob's images, or from an engine that carries them",
             phase == nvinfer1::TensorRTPhase::kBUILD ? "build" : "runtime");
      return nullptr;
    }
    std::string error;
    if (unpack_kernel_images(pack->data(), pack->size, &error) == nullptr) {
      log_error("GroupedMM plugin: " + error);
      return nullptr;
    }
    return new (std::nothrow) GroupedMMPlugin(trans_b, std::move(pack));
  }

  const PluginFieldCollection* getFieldNames() noexcept override { return &collection_; }
  const char* getPluginName() const noexcept override { return kGroupedMMName; }
  const char* getPluginVersion() const noexcept override { return kGroupedMMVersion; }
  const char* getPluginNamespace() const noexcept override { return kGroupedMMNamespace; }

 private:
  PluginField field_names_[2];
  PluginFieldCollection collection_{};
};

}  // namespace

KernelImagesForParsing::KernelImagesForParsing(const std::vector<uint8_t>* pack) { parsing_pack = pack; }
KernelImagesForParsing::~KernelImagesForParsing() { parsing_pack = nullptr; }

bool register_grouped_mm_plugin(nvinfer1::IPluginRegistry& registry, std::string* error) {
  static GroupedMMCreator creator;  // lives as long as the process, like the registry
  static bool registered = false;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (!registered) {
    registered = registry.registerCreator(creator, kGroupedMMNamespace);
    if (!registered) *error = "TensorRT refused to register the GroupedMM plugin creator (et_trt::GroupedMM v1)";
  }
  return registered;
}

}  // namespace et_trt
