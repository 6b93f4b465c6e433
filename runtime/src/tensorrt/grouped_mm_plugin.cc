#include "grouped_mm_plugin.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "grouped_mm_launcher.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::ILogger;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

std::atomic<ILogger*> plugin_logger{nullptr};
thread_local std::shared_ptr<const KernelPack> parsing_images;
thread_local std::string last_error;

void log(ILogger::Severity severity, const std::string& message) {
  log_plugin_message(severity, "GroupedMM plugin: " + message);
}

void refuse(const std::string& message) { refuse_plugin("GroupedMM plugin: " + message); }

// The kernel images' element type for a TensorRT type; UInt8 (no kernel) for any other.
blob::DType kernel_dtype_of(DataType type) {
  return type == DataType::kBF16 ? blob::DType::BFloat16 : type == DataType::kHALF ? blob::DType::Float16
                                                                                    : blob::DType::UInt8;
}

constexpr int32_t kDenseInputs = 3;  // a, b, offs
constexpr int32_t kFp8Inputs = 4;    // a, b (kFP8), offs, b_scale (kFLOAT); INT4: b kINT8, b_scale kBF16
// TensorRT does not document the alignment of a plugin's workspace: the plugin
// asks this much more and aligns the pointer itself (the launcher wants 256).
constexpr size_t kWorkspaceAlignment = 256;

bool is_form(int32_t nb_inputs) { return nb_inputs == kDenseInputs || nb_inputs == kFp8Inputs; }

// The weight format of a node: its group size (INT4), else its input count (FP8 or dense).
blob::WeightFormat weight_format_of(int32_t nb_inputs, int32_t group_size) {
  if (group_size > 0) return blob::WeightFormat::Int4GroupScaled;
  return nb_inputs == kFp8Inputs ? blob::WeightFormat::Float8RowScaled : blob::WeightFormat::Dense;
}

const char* format_name(blob::WeightFormat format) {
  return format == blob::WeightFormat::Int4GroupScaled ? " INT4" : format == blob::WeightFormat::Float8RowScaled ? " FP8" : "";
}

int64_t packed_row_bytes(int64_t k) { return (k + 31) / 32 * 16; }  // int4_weights.padded_k(k) / 2

const char* type_name(DataType type) {
  switch (type) {
    case DataType::kFLOAT: return "kFLOAT";
    case DataType::kHALF: return "kHALF";
    case DataType::kBF16: return "kBF16";
    case DataType::kINT8: return "kINT8";
    case DataType::kUINT8: return "kUINT8";
    case DataType::kINT32: return "kINT32";
    case DataType::kINT64: return "kINT64";
    case DataType::kFP8: return "kFP8";
    case DataType::kBOOL: return "kBOOL";
    default: return "another type";
  }
}

class GroupedMMPlugin final : public nvinfer1::IPluginV3,
                              public nvinfer1::IPluginV3OneCore,
                              public nvinfer1::IPluginV3OneBuild,
                              public nvinfer1::IPluginV3OneRuntime {
 public:
  GroupedMMPlugin(bool trans_b, int32_t activation, int32_t group_size, std::shared_ptr<const KernelPack> images)
      : trans_b_(trans_b ? 1 : 0), activation_(activation), group_size_(group_size), images_(std::move(images)) {}

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
  nvinfer1::IPluginV3* clone() noexcept override {
    auto* copy = new (std::nothrow) GroupedMMPlugin(trans_b_ != 0, activation_, group_size_, images_);
    if (copy != nullptr) copy->fp8_ = fp8_;
    return copy;
  }

  // ---- IPluginV3OneCore ----
  const char* getPluginName() const noexcept override { return kGroupedMMName; }
  const char* getPluginVersion() const noexcept override { return kGroupedMMVersion; }
  const char* getPluginNamespace() const noexcept override { return kGroupedMMNamespace; }

  // ---- IPluginV3OneBuild ----
  int32_t getNbOutputs() const noexcept override { return 1; }

  // The form is refused here, while parsing, saying what is wrong.
  int32_t getOutputDataTypes(DataType* outputs, int32_t nb_outputs, const DataType* inputs,
                             int32_t nb_inputs) const noexcept override {
    if (nb_outputs != 1) return -1;
    const std::string refusal = form_refusal(inputs, nb_inputs);
    if (!refusal.empty()) {
      log(ILogger::Severity::kERROR, refusal);
      return -1;
    }
    outputs[0] = inputs[0];
    return 0;
  }

  int32_t getOutputShapes(const DimsExprs* inputs, int32_t nb_inputs, const DimsExprs*, int32_t, DimsExprs* outputs,
                          int32_t nb_outputs, nvinfer1::IExprBuilder&) noexcept override {
    if (!is_form(nb_inputs) || nb_outputs != 1 || inputs[0].nbDims != 2 || inputs[1].nbDims != 3) {
      log(ILogger::Severity::kERROR, "expects a [rows, K], b [G, K, N] or [G, N, K], offs [G] (and b_scale [G, N] "
                                     "in the FP8 form)");
      return -1;
    }
    const int32_t scale_rank = group_size_ > 0 ? 3 : 2;
    if (nb_inputs == kFp8Inputs && !scale_shape_matches(inputs[1], inputs[3], scale_rank)) {
      log(ILogger::Severity::kERROR, std::string(group_size_ > 0 ? "the INT4 form's b_scale (input 3) must be [G, N, "
                                                                   "groups]" : "the FP8 form's b_scale (input 3) must "
                                                                   "be [G, N]") + " of b " + sizes(inputs[1]) +
                                         "; it is " + sizes(inputs[3]));
      return -1;
    }
    outputs[0].nbDims = 2;
    outputs[0].d[0] = inputs[0].d[0];  // rows: dynamic, whatever a has
    outputs[0].d[1] = inputs[1].d[trans_b_ ? 1 : 2];
    return 0;
  }

  bool supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* io, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override {
    if (!is_form(nb_inputs) || nb_outputs != 1 || pos < 0 || pos > nb_inputs) return false;
    const bool fp8 = nb_inputs == kFp8Inputs;
    const PluginTensorDesc& desc = io[pos].desc;
    if (desc.format != TensorFormat::kLINEAR) return false;
    const bool int4 = fp8 && group_size_ > 0;
    if (pos == 0) return has_images(desc.type, nb_inputs);
    if (pos == 2) return desc.type == DataType::kINT32;
    if (fp8 && pos == 1) return desc.type == (int4 ? DataType::kINT8 : DataType::kFP8);
    if (fp8 && pos == 3) return desc.type == (int4 ? DataType::kBF16 : DataType::kFLOAT);
    return desc.type == io[0].desc.type;  // dense b, and out, in a's dtype
  }

  int32_t configurePlugin(const DynamicPluginTensorDesc*, int32_t nb_inputs, const DynamicPluginTensorDesc*,
                          int32_t nb_outputs) noexcept override {
    if (!is_form(nb_inputs) || nb_outputs != 1) return -1;
    fp8_ = nb_inputs == kFp8Inputs;
    return 0;
  }

  // The FP8 form's activations, quantized, at the profile's max rows (an engine
  // records this size; the Python build-phase plugin asks the same). K is b's.
  size_t getWorkspaceSize(const DynamicPluginTensorDesc* inputs, int32_t nb_inputs, const DynamicPluginTensorDesc*,
                          int32_t) const noexcept override {
    if (nb_inputs != kFp8Inputs || group_size_ > 0) return 0;  // INT4 launches need none
    return kernels::GroupedMMLauncher::fp8_workspace_bytes(inputs[0].max.d[0], inputs[1].max.d[2]) +
           kWorkspaceAlignment - 1;
  }

  // ---- IPluginV3OneRuntime ----
  int32_t onShapeChange(const PluginTensorDesc* in, int32_t nb_inputs, const PluginTensorDesc*,
                        int32_t nb_outputs) noexcept override {
    if (!is_form(nb_inputs) || nb_outputs != 1) return -1;
    const nvinfer1::Dims &a = in[0].dims, &b = in[1].dims, &offs = in[2].dims;
    const int64_t k = k_of(a, b);
    const int64_t a_columns = activation_ == kActivationSwiGLU ? 2 * k : k;  // a gate+up output holds 2K
    bool consistent =
        a.nbDims == 2 && b.nbDims == 3 && offs.nbDims == 1 && a.d[1] == a_columns && offs.d[0] == b.d[0];
    if (group_size_ > 0) {
      if (nb_inputs != kFp8Inputs) return -1;  // refused at parse time (form_refusal); b_scale is in[3]
      const nvinfer1::Dims& scale = in[3].dims;
      consistent = consistent && b.d[2] == packed_row_bytes(k) && scale.nbDims == 3 && scale.d[0] == b.d[0] &&
                   scale.d[1] == b.d[1] && scale.d[2] == (k + group_size_ - 1) / group_size_;
      if (!consistent) {
        log(ILogger::Severity::kERROR, "inconsistent INT4 shapes: a" + dims_text(a) + ", b" + dims_text(b) + ", offs" +
                                           dims_text(offs) + ", b_scale" + dims_text(scale) + " (group_size " +
                                           std::to_string(group_size_) + "; b must be [G, N, round_up(K, 32) / 2], "
                                           "b_scale [G, N, ceil(K / group_size)])");
        return -1;
      }
    } else if (nb_inputs == kFp8Inputs) {
      const nvinfer1::Dims& scale = in[3].dims;
      consistent = consistent && trans_b_ != 0 && scale.nbDims == 2 && scale.d[0] == b.d[0] && scale.d[1] == b.d[1];
    }
    if (!consistent) {
      char text[320];
      std::snprintf(text, sizeof(text),
                    "inconsistent shapes a[%lld, %lld], b[%lld, %lld, %lld], offs[%lld]%s (trans_b=%d%s)",
                    (long long)a.d[0], (long long)a.d[1], (long long)b.d[0], (long long)b.d[1], (long long)b.d[2],
                    (long long)offs.d[0], nb_inputs == kFp8Inputs ? ", b_scale of another shape than [G, N]" : "",
                    trans_b_, activation_ == kActivationSwiGLU ? ", activation=1: a is [rows, 2K]" : "");
      log(ILogger::Severity::kERROR, text);
      return -1;
    }
    fp8_ = nb_inputs == kFp8Inputs;
    return 0;
  }

  int32_t enqueue(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                  void* const* outputs, void* workspace, cudaStream_t stream) noexcept override {
    std::string error;
    if (launcher_ == nullptr && !create_launcher(in[0].type, &error)) {
      log(ILogger::Severity::kERROR, error);
      return -1;
    }
    const nvinfer1::Dims &a = in[0].dims, &b = in[1].dims;
    const int64_t rows = a.d[0], k = k_of(a, b), n = b.d[trans_b_ ? 1 : 2], groups = b.d[0];
    kernels::Fp8Operands fp8;
    kernels::Int4Operands int4;
    const bool int4_form = fp8_ && group_size_ > 0;
    if (int4_form) {
      int4.b_scale = inputs[3];
      int4.group_size = group_size_;
    } else if (fp8_) {
      // TensorRT's workspace is getWorkspaceSize's bytes: the launcher's, plus the slack to align it here.
      const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
      const uintptr_t aligned = (base + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
      fp8.b_scale = static_cast<const float*>(inputs[3]);
      fp8.workspace = reinterpret_cast<void*>(aligned);
      fp8.workspace_bytes = kernels::GroupedMMLauncher::fp8_workspace_bytes(rows, k);
      fp8.swiglu = activation_ == kActivationSwiGLU;
    }
    if (!launcher_->launch(inputs[0], inputs[1], static_cast<const int32_t*>(inputs[2]), outputs[0], rows, k, n,
                           groups, trans_b_ != 0, reinterpret_cast<CUstream>(stream), &error,
                           fp8_ && !int4_form ? &fp8 : nullptr, nullptr, int4_form ? &int4 : nullptr)) {
      log(ILogger::Severity::kERROR, error);
      return -1;
    }
    return 0;
  }

  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }

  const PluginFieldCollection* getFieldsToSerialize() noexcept override {
    fields_[0] = PluginField(kTransBField, &trans_b_, PluginFieldType::kINT32, 1);
    fields_[1] = PluginField(kKernelImagesIdField, images_->id().data(), PluginFieldType::kUNKNOWN,
                             static_cast<int32_t>(images_->id().size()));
    fields_[2] = PluginField(kActivationField, &activation_, PluginFieldType::kINT32, 1);
    fields_[3] = PluginField(kGroupSizeField, &group_size_, PluginFieldType::kINT32, 1);
    collection_.nbFields = 4;
    collection_.fields = fields_;
    return &collection_;
  }

 private:
  bool has_images(DataType type, int32_t nb_inputs) const {
    const blob::DType dtype = kernel_dtype_of(type);
    return kernels::kernel_dtype_name(dtype) != nullptr &&
           !images_->images(dtype, trans_b_ != 0, weight_format_of(nb_inputs, group_size_)).empty();
  }

  // K: a's columns in the INT4 form (b's rows are packed bytes), else b's.
  int64_t k_of(const nvinfer1::Dims& a, const nvinfer1::Dims& b) const {
    return group_size_ > 0 ? a.d[1] : b.d[trans_b_ ? 2 : 1];
  }

  // Why this plugin cannot serve a node of these input types, or "" if it can.
  std::string form_refusal(const DataType* inputs, int32_t nb_inputs) const {
    if (!is_form(nb_inputs))
      return "GroupedMM takes 3 inputs (a, b, offs) or 4 (a, b FP8, offs, b_scale); the node has " +
             std::to_string(nb_inputs);
    const bool fp8 = nb_inputs == kFp8Inputs;
    if (group_size_ > 0) {
      if (!fp8) return "group_size=" + std::to_string(group_size_) + " (the INT4 form) needs 4 inputs (a, b, offs, b_scale); "
                       "the node has " + std::to_string(nb_inputs);
      if (trans_b_ == 0) return "the INT4 form needs trans_b=1: its weights are [G, N, K]; the node has trans_b=0";
      if (activation_ != kActivationNone) return "the INT4 form takes activation=0 (a holds the activations)";
      if (inputs[1] != DataType::kINT8)
        return std::string("the INT4 form's b (input 1) must be INT8 (packed INT4 bytes) [G, N, round_up(K, 32) / 2]; it is ") +
               type_name(inputs[1]);
      if (inputs[3] != DataType::kBF16)
        return std::string("the INT4 form's b_scale (input 3) must be bfloat16 [G, N, groups]; it is ") +
               type_name(inputs[3]);
    }
    if (!fp8 && activation_ == kActivationSwiGLU)
      return "activation=1 (a gate+up output as a) is the FP8 form's only (4 inputs); the node has 3";
    if (fp8 && trans_b_ == 0)
      return "the FP8 form (4 inputs) needs trans_b=1: its weights are [G, N, K]; the node has trans_b=0";
    if (fp8 && group_size_ == 0 && inputs[1] != DataType::kFP8)
      return std::string("the FP8 form's b (input 1) must be FLOAT8E4M3FN (TensorRT FP8) [G, N, K]; it is ") +
             type_name(inputs[1]);
    if (fp8 && group_size_ == 0 && inputs[3] != DataType::kFLOAT)
      return std::string("the FP8 form's b_scale (input 3) must be float32 [G, N]; it is ") + type_name(inputs[3]);
    if (!has_images(inputs[0], nb_inputs)) {
      const char* dtype = kernels::kernel_dtype_name(kernel_dtype_of(inputs[0]));
      std::string has;
      for (DataType type : {DataType::kBF16, DataType::kHALF}) {
        if (has_images(type, nb_inputs)) has += (has.empty() ? "" : ", ") + std::string(type == DataType::kBF16 ? "bf16" : "fp16");
      }
      return std::string("the blob has no ") + (dtype != nullptr ? dtype : type_name(inputs[0])) +
             format_name(weight_format_of(nb_inputs, group_size_)) + " kernel image for trans_b=" +
             std::to_string(trans_b_) + " (it has " +
             (has.empty() ? "none" : has) + "); the node's inputs must be of those";
    }
    return "";
  }

  // "[4, 48, 64]" for messages; "?" for a size not known at build time.
  static std::string sizes(const DimsExprs& dims) {
    std::string text = "[";
    for (int i = 0; i < dims.nbDims; ++i) {
      if (i > 0) text += ", ";
      text += dims.d[i]->isConstant() ? std::to_string(dims.d[i]->getConstantValue()) : "?";
    }
    return text + "]";
  }

  // b_scale [G, N] (FP8; INT4: [G, N, groups]) of b [G, N, ...]: both are weights, so their sizes are known at
  // build time.
  static bool scale_shape_matches(const DimsExprs& b, const DimsExprs& scale, int32_t rank) {
    if (scale.nbDims != rank) return false;
    for (int i = 0; i < 2; ++i) {
      if (!scale.d[i]->isConstant() || !b.d[i]->isConstant() ||
          scale.d[i]->getConstantValue() != b.d[i]->getConstantValue())
        return false;
    }
    return true;
  }

  bool create_launcher(DataType type, std::string* error) {
    const blob::DType dtype = kernel_dtype_of(type);
    if (kernels::kernel_dtype_name(dtype) == nullptr) {
      *error = "a must be bf16 or fp16";
      return false;
    }
    const blob::WeightFormat format = weight_format_of(fp8_ ? kFp8Inputs : kDenseInputs, group_size_);
    const auto images = images_->images(dtype, trans_b_ != 0, format);
    if (images.empty()) {
      *error = std::string("the blob has no ") + kernels::kernel_dtype_name(dtype) + format_name(format) +
               " kernel image for trans_b=" + std::to_string(trans_b_) +
               "; re-export with grouped_gemm_kernel on and this dtype";
      return false;
    }
    launcher_ = kernels::GroupedMMLauncher::create(images, error);
    return launcher_ != nullptr;
  }

  int32_t trans_b_;
  int32_t activation_;  // kActivationNone or kActivationSwiGLU
  int32_t group_size_;  // > 0: the INT4 form
  std::shared_ptr<const KernelPack> images_;
  bool fp8_ = false;  // 4 inputs (the FP8 form, or the INT4 one with group_size_), as configurePlugin / onShapeChange saw
  std::unique_ptr<kernels::GroupedMMLauncher> launcher_;
  PluginField fields_[4];
  PluginFieldCollection collection_{};
};

class GroupedMMCreator final : public nvinfer1::IPluginCreatorV3One {
 public:
  // The ONNX node's attributes: trans_b, activation and group_size. kernel_images_id comes from a
  // serialized engine (or the images being parsed), so it is not listed: the
  // parser would warn about every node that lacks it.
  GroupedMMCreator() {
    field_names_[0] = PluginField(kTransBField, nullptr, PluginFieldType::kINT32, 1);
    field_names_[1] = PluginField(kActivationField, nullptr, PluginFieldType::kINT32, 1);
    field_names_[2] = PluginField(kGroupSizeField, nullptr, PluginFieldType::kINT32, 1);
    collection_.nbFields = 3;
    collection_.fields = field_names_;
  }

  nvinfer1::IPluginV3* createPlugin(const char*, const PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override {
    const PluginField* trans_b_field = nullptr;
    const PluginField* activation_field = nullptr;  // absent in engines and ONNX from before the field: none
    const PluginField* id_field = nullptr;
    const PluginField* group_field = nullptr;  // absent in engines and ONNX from before the field: not INT4
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
      const PluginField& f = fc->fields[i];
      if (f.name == nullptr || f.data == nullptr || f.length < 1) continue;
      if (std::strcmp(f.name, kTransBField) == 0) {
        trans_b_field = &f;
      } else if (std::strcmp(f.name, kGroupSizeField) == 0) {
        group_field = &f;
      } else if (std::strcmp(f.name, kActivationField) == 0) {
        activation_field = &f;
      } else if (std::strcmp(f.name, kKernelImagesIdField) == 0) {
        id_field = &f;
      }
    }
    std::shared_ptr<const KernelPack> images = node_kernel_images(id_field, phase, kGroupedMMName);
    if (images == nullptr) return nullptr;
    if (trans_b_field == nullptr) {
      refuse(std::string("field ") + kTransBField + " is missing");
      return nullptr;
    }
    const int64_t trans_b = one_int_field(*trans_b_field);
    if (trans_b != 0 && trans_b != 1) {
      refuse(std::string("field ") + kTransBField + " must be one integer, 0 or 1; got " + field_text(*trans_b_field));
      return nullptr;
    }
    const int64_t activation = activation_field != nullptr ? one_int_field(*activation_field) : kActivationNone;
    if (activation != kActivationNone && activation != kActivationSwiGLU) {
      refuse("field activation must be 0 (a holds the activations) or 1 (a gate+up output, its SwiGLU), got " +
             field_text(*activation_field));
      return nullptr;
    }
    const int32_t group_size = group_size_field(group_field, kGroupedMMName);
    if (group_size < 0) return nullptr;
    return new (std::nothrow)
        GroupedMMPlugin(trans_b == 1, static_cast<int32_t>(activation), group_size, std::move(images));
  }

  const PluginFieldCollection* getFieldNames() noexcept override { return &collection_; }
  const char* getPluginName() const noexcept override { return kGroupedMMName; }
  const char* getPluginVersion() const noexcept override { return kGroupedMMVersion; }
  const char* getPluginNamespace() const noexcept override { return kGroupedMMNamespace; }

 private:
  PluginField field_names_[3];
  PluginFieldCollection collection_{};
};

}  // namespace

nvinfer1::IPluginCreatorV3One& grouped_mm_creator() {
  static GroupedMMCreator* creator = new GroupedMMCreator;  // never destroyed: registries outlive statics
  return *creator;
}

bool register_grouped_mm_plugin(nvinfer1::IPluginRegistry& registry, std::string* error) {
  return register_creator_once(registry, grouped_mm_creator(), error);
}

bool register_creator_once(nvinfer1::IPluginRegistry& registry, nvinfer1::IPluginCreatorV3One& creator,
                           std::string* error) {
  // One registry per provider library (TensorRT, TensorRT for RTX), each creator once in each.
  static std::set<std::pair<nvinfer1::IPluginRegistry*, nvinfer1::IPluginCreatorV3One*>> registered;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (registered.count({&registry, &creator}) != 0) return true;
  const std::string name = std::string(creator.getPluginNamespace()) + "::" + creator.getPluginName() + " v" +
                           creator.getPluginVersion();
  // Registered already when this library was loaded as a plugin library (getCreators) into the same registry.
  nvinfer1::IPluginCreatorInterface* present =
      registry.getCreator(creator.getPluginName(), creator.getPluginVersion(), creator.getPluginNamespace());
  if (present == &creator) {
    registered.insert({&registry, &creator});
    return true;
  }
  if (present != nullptr) {
    *error = "another library's " + std::string(creator.getPluginName()) + " plugin (" + name +
             ") is registered with TensorRT in this process; load one et-trt library per process";
    return false;
  }
  if (!registry.registerCreator(creator, creator.getPluginNamespace())) {
    *error = std::string("TensorRT refused to register the ") + creator.getPluginName() + " plugin creator (" + name +
             ")";
    return false;
  }
  registered.insert({&registry, &creator});
  return true;
}

void set_grouped_mm_logger(nvinfer1::ILogger* logger) { plugin_logger.store(logger); }

void log_plugin_message(ILogger::Severity severity, const std::string& text) {
  if (ILogger* logger = plugin_logger.load()) {
    logger->log(severity, text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
}

void refuse_plugin(const std::string& text) {
  last_error = text;
  log_plugin_message(ILogger::Severity::kERROR, text);
}

int64_t int_field(const PluginField& f, int64_t fallback) {
  if (f.type == PluginFieldType::kINT32) return *static_cast<const int32_t*>(f.data);
  if (f.type == PluginFieldType::kINT64) return *static_cast<const int64_t*>(f.data);
  return fallback;
}

int64_t one_int_field(const PluginField& f) {
  if (f.length != 1 || (f.type != PluginFieldType::kINT32 && f.type != PluginFieldType::kINT64)) return -1;
  return int_field(f, -1);
}

std::string dims_text(const nvinfer1::Dims& dims) {
  std::string text = "[";
  for (int i = 0; i < dims.nbDims; ++i) text += (i ? ", " : "") + std::to_string(dims.d[i]);
  return text + "]";
}

int32_t group_size_field(const PluginField* field, const char* plugin) {
  if (field == nullptr) return 0;
  const int64_t value = one_int_field(*field);
  if (value != 0 && value != 32 && value != 64 && value != 128) {
    refuse_plugin(std::string(plugin) + " plugin: field " + kGroupSizeField +
                  " must be one integer: 0 (weights not INT4) or the INT4 scale groups' size 32, 64 or 128; got " +
                  field_text(*field));
    return -1;
  }
  return static_cast<int32_t>(value);
}

std::string field_text(const PluginField& f) {
  if (f.type == PluginFieldType::kINT32 || f.type == PluginFieldType::kINT64) {
    return std::string(f.type == PluginFieldType::kINT32 ? "INT32 [" : "INT64 [") + std::to_string(int_field(f, 0)) +
           (f.length > 1 ? ", ...]" : "]");
  }
  if (f.type == PluginFieldType::kFLOAT32) {
    char value[32];
    std::snprintf(value, sizeof(value), "%g", static_cast<double>(*static_cast<const float*>(f.data)));
    return std::string("FLOAT32 [") + value + (f.length > 1 ? ", ...]" : "]");
  }
  return "a field of type " + std::to_string(static_cast<int>(f.type));
}

bool is_byte_field(PluginFieldType type) {
  return type == PluginFieldType::kUNKNOWN || type == PluginFieldType::kINT8 || type == PluginFieldType::kCHAR;
}

std::shared_ptr<const KernelPack> node_kernel_images(const PluginField* id_field, nvinfer1::TensorRTPhase phase,
                                                     const char* plugin) {
  const std::string where =
      std::string(plugin) + " plugin: " + (phase == nvinfer1::TensorRTPhase::kBUILD ? "building" : "loading an engine");
  if (id_field == nullptr) {
    if (parsing_images == nullptr) {
      refuse_plugin(where + ": no kernel images: a " + plugin + " node from ONNX takes the images of the blob being "
                    "parsed, and none was given (the et-trt runtime gives its blob's; with libet_trt_plugin.so call "
                    "et_trt_plugin_use_kernel_images before parsing)");
    }
    return parsing_images;
  }
  KernelImagesId id{};
  if (!is_byte_field(id_field->type) || id_field->length != static_cast<int32_t>(id.size())) {
    refuse_plugin(where + ": field " + kKernelImagesIdField + " must be 32 bytes (a sha256), got " +
                  std::to_string(id_field->length) + " elements of field type " +
                  std::to_string(static_cast<int>(id_field->type)));
    return nullptr;
  }
  std::memcpy(id.data(), id_field->data, id.size());
  std::shared_ptr<const KernelPack> images = find_kernel_images(id);
  if (images == nullptr) {
    refuse_plugin(where + ": the engine's kernel images " + to_hex(id) +
                  " are not loaded: no et-trt blob with these images was registered in this process. Load the "
                  "engine through the et-trt runtime together with the .pte it was exported in (or, with "
                  "libet_trt_plugin.so, pass that blob to et_trt_plugin_use_kernel_images first)");
  }
  return images;
}

std::string take_grouped_mm_error() {
  std::string error;
  error.swap(last_error);
  return error;
}

void set_parsing_kernel_images(std::shared_ptr<const KernelPack> images) { parsing_images = std::move(images); }

KernelImagesForParsing::KernelImagesForParsing(std::shared_ptr<const KernelPack> images)
    : previous_(std::move(parsing_images)) {
  parsing_images = std::move(images);
}

KernelImagesForParsing::~KernelImagesForParsing() { parsing_images = std::move(previous_); }

}  // namespace et_trt
