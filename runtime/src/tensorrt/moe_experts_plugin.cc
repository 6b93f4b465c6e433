#include "moe_experts_plugin.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "grouped_mm_plugin.h"  // the shared logger, refusals and kernel-image resolution
#include "kernel_images.h"
#include "moe_experts_launcher.h"

namespace et_trt {
namespace {

using kernels::GateUpLayout;
using kernels::MoEActivation;
using kernels::MoEExpertsLauncher;
using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::ILogger;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

// The node's inputs, in the ONNX op's order; the two biases are optional (trailing, ONNX-style). The quantized
// forms have all nine: their weights, both biases (the lowering writes zeros for a missing one) and the weights'
// scales. The weight format follows from the node, as GroupedMM's: group_size > 0 is INT4 (packed weights, bfloat16
// group scales [E, N, groups]); else nine inputs are FP8 (e4m3 weights, float32 scales per output channel [E, N]).
enum Input : int32_t { kHidden = 0, kIds, kWeights, kGateUp, kDown, kGateUpBias, kDownBias, kGateUpScale, kDownScale };
constexpr int32_t kMinInputs = kDown + 1;
constexpr int32_t kMaxDenseInputs = kDownBias + 1;
constexpr int32_t kQuantizedInputs = kDownScale + 1;
constexpr int32_t kRanks[kQuantizedInputs] = {2, 2, 2, 3, 3, 2, 2, 3, 3};  // the scales: INT4's; FP8's are rank 2
constexpr const char* kInputNames[kQuantizedInputs] = {"hidden",    "topk_ids", "topk_weights",    "w_gate_up",
                                                       "w_down",    "b_gate_up", "b_down", "w_gate_up_scale",
                                                       "w_down_scale"};
// Kernels whose images serve either weight format: they read no weights (et_trt_backend/kernels/moe_op.py's
// _ANY_FORMAT).
constexpr const char* kAnyFormatKernels[] = {"moe_route", "moe_combine"};
// As GroupedMM's: TensorRT does not document its workspace's alignment; the plugin aligns the pointer itself.
constexpr size_t kWorkspaceAlignment = 256;

void log(ILogger::Severity severity, const std::string& message) {
  log_plugin_message(severity, std::string(kMoEExpertsName) + " plugin: " + message);
}

void refuse(const std::string& message) { refuse_plugin(std::string(kMoEExpertsName) + " plugin: " + message); }

blob::DType kernel_dtype_of(DataType type) {
  return type == DataType::kBF16 ? blob::DType::BFloat16 : type == DataType::kHALF ? blob::DType::Float16
                                                                                    : blob::DType::UInt8;
}

const char* type_name(DataType type) {
  switch (type) {
    case DataType::kFLOAT: return "kFLOAT";
    case DataType::kHALF: return "kHALF";
    case DataType::kBF16: return "kBF16";
    case DataType::kINT32: return "kINT32";
    case DataType::kINT64: return "kINT64";
    case DataType::kINT8: return "kINT8";
    case DataType::kFP8: return "kFP8";
    default: return "another type";
  }
}

class MoEExpertsPlugin final : public nvinfer1::IPluginV3,
                               public nvinfer1::IPluginV3OneCore,
                               public nvinfer1::IPluginV3OneBuild,
                               public nvinfer1::IPluginV3OneRuntime {
 public:
  MoEExpertsPlugin(int32_t activation, std::string layout_name, GateUpLayout layout, float alpha, float limit,
                   int32_t group_size, std::shared_ptr<const KernelPack> images)
      : activation_(activation), layout_name_(std::move(layout_name)), layout_(layout), alpha_(alpha),
        limit_(limit), group_size_(group_size), images_(std::move(images)) {}

  // ---- IPluginV3 ----
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }

  // A clone shares the images and makes its own launcher (one per execution context, as GroupedMM's).
  nvinfer1::IPluginV3* clone() noexcept override {
    auto* copy =
        new (std::nothrow) MoEExpertsPlugin(activation_, layout_name_, layout_, alpha_, limit_, group_size_, images_);
    if (copy != nullptr) copy->nb_inputs_ = nb_inputs_;
    return copy;
  }

  // ---- IPluginV3OneCore ----
  const char* getPluginName() const noexcept override { return kMoEExpertsName; }
  const char* getPluginVersion() const noexcept override { return kMoEExpertsVersion; }
  const char* getPluginNamespace() const noexcept override { return kMoEExpertsNamespace; }

  // ---- IPluginV3OneBuild ----
  int32_t getNbOutputs() const noexcept override { return 1; }

  // The input types are refused here, while parsing, saying what is wrong.
  int32_t getOutputDataTypes(DataType* outputs, int32_t nb_outputs, const DataType* inputs,
                             int32_t nb_inputs) const noexcept override {
    if (nb_outputs != 1) return -1;
    const std::string refusal = type_refusal(inputs, nb_inputs);
    if (!refusal.empty()) {
      log(ILogger::Severity::kERROR, refusal);
      return -1;
    }
    outputs[0] = inputs[kHidden];
    return 0;
  }

  int32_t getOutputShapes(const DimsExprs* inputs, int32_t nb_inputs, const DimsExprs*, int32_t, DimsExprs* outputs,
                          int32_t nb_outputs, nvinfer1::IExprBuilder&) noexcept override {
    if (!has_input_count(nb_inputs) || nb_outputs != 1) return -1;
    for (int32_t i = 0; i < nb_inputs; ++i) {
      if (inputs[i].nbDims != rank_of(i, nb_inputs)) {
        log(ILogger::Severity::kERROR, std::string(kInputNames[i]) + " has rank " + std::to_string(inputs[i].nbDims) +
                                           "; the plugin needs rank " + std::to_string(rank_of(i, nb_inputs)));
        return -1;
      }
    }
    outputs[0] = inputs[kHidden];  // [T, H]: T dynamic, whatever hidden has
    return 0;
  }

  bool supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* io, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override {
    if (!has_input_count(nb_inputs) || nb_outputs != 1 || pos < 0 || pos > nb_inputs) return false;
    const PluginTensorDesc& desc = io[pos].desc;
    if (desc.format != TensorFormat::kLINEAR) return false;
    const blob::WeightFormat format = format_of(nb_inputs);
    if (pos == kHidden) return has_images(desc.type, format);
    if (pos == kIds) return desc.type == DataType::kINT32;
    if (pos == kWeights) return desc.type == DataType::kFLOAT || desc.type == io[kHidden].desc.type;
    if (pos == kGateUp || pos == kDown || pos == kGateUpScale || pos == kDownScale)
      return desc.type == expected_type(pos, format, io[kHidden].desc.type);
    return desc.type == io[kHidden].desc.type;  // biases and the output
  }

  int32_t configurePlugin(const DynamicPluginTensorDesc*, int32_t nb_inputs, const DynamicPluginTensorDesc*,
                          int32_t nb_outputs) noexcept override {
    if (!has_input_count(nb_inputs) || nb_outputs != 1) return -1;
    nb_inputs_ = nb_inputs;
    return 0;
  }

  // The launcher's workspace at the profile's largest token count (an engine records this size).
  size_t getWorkspaceSize(const DynamicPluginTensorDesc* inputs, int32_t nb_inputs, const DynamicPluginTensorDesc*,
                          int32_t) const noexcept override {
    if (!has_input_count(nb_inputs)) return 0;
    const nvinfer1::Dims &hidden = inputs[kHidden].max, &ids = inputs[kIds].max, &down = inputs[kDown].max;
    return MoEExpertsLauncher::workspace_bytes(hidden.d[0], ids.d[1], down.d[0], hidden.d[1],
                                               ffn_of(inputs[kGateUp].max, down)) +
           kWorkspaceAlignment - 1;
  }

  // ---- IPluginV3OneRuntime ----
  int32_t onShapeChange(const PluginTensorDesc* in, int32_t nb_inputs, const PluginTensorDesc*,
                        int32_t nb_outputs) noexcept override {
    if (!has_input_count(nb_inputs) || nb_outputs != 1) return -1;
    const std::string problem = shape_problem(in, nb_inputs);
    if (!problem.empty()) {
      log(ILogger::Severity::kERROR, problem);
      return -1;
    }
    nb_inputs_ = nb_inputs;
    return 0;
  }

  int32_t enqueue(const PluginTensorDesc* in, const PluginTensorDesc*, const void* const* inputs,
                  void* const* outputs, void* workspace, cudaStream_t stream) noexcept override {
    std::string error;
    const blob::WeightFormat format = format_of(nb_inputs_);
    if (launcher_ == nullptr && !create_launcher(in[kHidden].type, format, &error)) {
      log(ILogger::Severity::kERROR, error);
      return -1;
    }
    kernels::MoEExpertsArgs args;
    args.hidden = inputs[kHidden];
    args.topk_ids = static_cast<const int32_t*>(inputs[kIds]);
    args.topk_weights = inputs[kWeights];
    args.weights_fp32 = in[kWeights].type == DataType::kFLOAT;
    args.w_gate_up = inputs[kGateUp];
    args.w_down = inputs[kDown];
    args.b_gate_up = nb_inputs_ > kGateUpBias ? inputs[kGateUpBias] : nullptr;
    args.b_down = nb_inputs_ > kDownBias ? inputs[kDownBias] : nullptr;
    args.out = outputs[0];
    args.tokens = in[kHidden].dims.d[0];
    args.hidden_size = in[kHidden].dims.d[1];
    args.top_k = in[kIds].dims.d[1];
    args.experts = in[kDown].dims.d[0];
    args.ffn = ffn_of(in[kGateUp].dims, in[kDown].dims);
    if (format != blob::WeightFormat::Dense) {
      args.w_gate_up_scale = inputs[kGateUpScale];
      args.w_down_scale = inputs[kDownScale];
      args.group_size = group_size_;  // 0 for FP8
    }
    args.activation = static_cast<MoEActivation>(activation_);
    args.layout = layout_;
    args.alpha = alpha_;
    args.limit = limit_;
    // TensorRT's workspace is getWorkspaceSize's bytes: the launcher's, plus the slack to align it here.
    const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
    args.workspace = reinterpret_cast<void*>((base + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
                                             kWorkspaceAlignment);
    args.workspace_bytes =
        MoEExpertsLauncher::workspace_bytes(args.tokens, args.top_k, args.experts, args.hidden_size, args.ffn);
    if (!launcher_->launch(args, reinterpret_cast<CUstream>(stream), &error)) {
      log(ILogger::Severity::kERROR, error);
      return -1;
    }
    return 0;
  }

  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext*) noexcept override { return clone(); }

  const PluginFieldCollection* getFieldsToSerialize() noexcept override {
    fields_[0] = PluginField(kMoEActivationField, &activation_, PluginFieldType::kINT32, 1);
    fields_[1] = PluginField(kMoELayoutField, layout_name_.data(), PluginFieldType::kCHAR,
                             static_cast<int32_t>(layout_name_.size()));
    fields_[2] = PluginField(kMoEAlphaField, &alpha_, PluginFieldType::kFLOAT32, 1);
    fields_[3] = PluginField(kMoELimitField, &limit_, PluginFieldType::kFLOAT32, 1);
    fields_[4] = PluginField(kKernelImagesIdField, images_->id().data(), PluginFieldType::kUNKNOWN,
                             static_cast<int32_t>(images_->id().size()));
    fields_[5] = PluginField(kGroupSizeField, &group_size_, PluginFieldType::kINT32, 1);
    collection_.nbFields = 6;
    collection_.fields = fields_;
    return &collection_;
  }

 private:
  bool gated() const { return kernels::is_gated(static_cast<MoEActivation>(activation_)); }
  bool int4() const { return group_size_ > 0; }

  bool has_input_count(int32_t nb_inputs) const {
    return nb_inputs == kQuantizedInputs || (!int4() && nb_inputs >= kMinInputs && nb_inputs <= kMaxDenseInputs);
  }

  // The weight format of a node of this many inputs (one the plugin takes: has_input_count).
  blob::WeightFormat format_of(int32_t nb_inputs) const {
    if (int4()) return blob::WeightFormat::Int4GroupScaled;
    return nb_inputs == kQuantizedInputs ? blob::WeightFormat::Float8RowScaled : blob::WeightFormat::Dense;
  }

  int32_t rank_of(int32_t input, int32_t nb_inputs) const {
    return input >= kGateUpScale && format_of(nb_inputs) == blob::WeightFormat::Float8RowScaled ? 2 : kRanks[input];
  }

  // The type the weights and scales (inputs kGateUp, kDown, kGateUpScale, kDownScale) must have in `format`.
  static DataType expected_type(int32_t input, blob::WeightFormat format, DataType hidden) {
    const bool scale = input >= kGateUpScale;
    switch (format) {
      case blob::WeightFormat::Int4GroupScaled: return scale ? DataType::kBF16 : DataType::kINT8;
      case blob::WeightFormat::Float8RowScaled: return scale ? DataType::kFLOAT : DataType::kFP8;
      default: return hidden;
    }
  }

  // " of INT4 weights", " of FP8 weights" or "" (messages about the node's images).
  static const char* format_text(blob::WeightFormat format) {
    return format == blob::WeightFormat::Int4GroupScaled   ? " of INT4 weights"
           : format == blob::WeightFormat::Float8RowScaled ? " of FP8 weights"
                                                            : "";
  }

  // F: w_down's columns, or in the INT4 form (whose w_down rows are packed bytes) from w_gate_up's N1 rows.
  int64_t ffn_of(const nvinfer1::Dims& gate_up, const nvinfer1::Dims& down) const {
    if (!int4()) return down.d[2];
    return gated() ? gate_up.d[1] / 2 : gate_up.d[1];
  }

  // The node's images: the MoE kernels' of its dtype and weight format (INT4, FP8: with the route and combine images
  // that are dense, reading no weights).
  std::vector<kernels::KernelImageRef> moe_images(DataType type, blob::WeightFormat format) const {
    std::vector<kernels::KernelImageRef> found;
    const blob::DType dtype = kernel_dtype_of(type);
    for (const auto& image : images_->images(dtype, /*trans_b=*/true, format)) {
      if (kernels::is_moe_experts_image(*image.fields)) found.push_back(image);
    }
    if (format == blob::WeightFormat::Dense) return found;
    for (const auto& image : images_->images(dtype, /*trans_b=*/true)) {
      for (const char* kernel : kAnyFormatKernels) {
        if (image.fields->kernel == kernel) found.push_back(image);
      }
    }
    return found;
  }

  bool has_images(DataType type, blob::WeightFormat format) const {
    return kernels::kernel_dtype_name(kernel_dtype_of(type)) != nullptr && !moe_images(type, format).empty();
  }

  // Why this plugin cannot serve a node of these input types, or "" if it can.
  std::string type_refusal(const DataType* inputs, int32_t nb_inputs) const {
    if (!has_input_count(nb_inputs))
      return int4() ? "group_size=" + std::to_string(group_size_) + " (INT4 weights) takes 9 inputs (hidden, topk_ids, "
                      "topk_weights, w_gate_up, w_down, b_gate_up, b_down, w_gate_up_scale, w_down_scale); the node "
                      "has " + std::to_string(nb_inputs)
                    : "MoEExperts takes 5 inputs (hidden, topk_ids, topk_weights, w_gate_up, w_down) and up to 2 "
                      "biases, or 9 with FP8 weights (both biases, then w_gate_up_scale, w_down_scale); the node "
                      "has " + std::to_string(nb_inputs);
    const DataType hidden = inputs[kHidden];
    const blob::WeightFormat format = format_of(nb_inputs);
    if (!has_images(hidden, format)) {
      std::string has;
      for (DataType type : {DataType::kBF16, DataType::kHALF}) {
        if (has_images(type, format))
          has += (has.empty() ? "" : ", ") + std::string(type == DataType::kBF16 ? "bf16" : "fp16");
      }
      return std::string("the blob has no MoE experts kernel image") + format_text(format) + " for hidden's " +
             type_name(hidden) + " (it has " + (has.empty() ? "none" : has) + "); re-export with fused_experts on" +
             (format == blob::WeightFormat::Float8RowScaled ? ", expert_precision = \"fp8\"" : "") +
             " and this precision";
    }
    if (inputs[kIds] != DataType::kINT32)
      return std::string("topk_ids must be kINT32; it is ") + type_name(inputs[kIds]);
    if (inputs[kWeights] != DataType::kFLOAT && inputs[kWeights] != hidden)
      return std::string("topk_weights must be kFLOAT or hidden's ") + type_name(hidden) + "; it is " +
             type_name(inputs[kWeights]);
    for (int32_t i = kGateUp; i < nb_inputs; ++i) {
      const bool weights = i == kGateUp || i == kDown || i >= kGateUpScale, scale = i >= kGateUpScale;
      const DataType want = weights ? expected_type(i, format, hidden) : hidden;
      if (inputs[i] == want) continue;
      const char* why = !weights || format == blob::WeightFormat::Dense ? ""
                        : format == blob::WeightFormat::Int4GroupScaled
                            ? (scale ? " (INT4 group scales)" : " (packed INT4 bytes)")
                            : (scale ? " (FP8 scales per output channel)" : " (FP8 e4m3 weights)");
      return std::string(kInputNames[i]) + " must be " + (*why == '\0' ? "hidden's " : "") + type_name(want) + why +
             "; it is " + type_name(inputs[i]);
    }
    return "";
  }

  // Why these runtime shapes are not one MoE block's, or "" if they are.
  std::string shape_problem(const PluginTensorDesc* in, int32_t nb_inputs) const {
    const nvinfer1::Dims &hidden = in[kHidden].dims, &ids = in[kIds].dims, &weights = in[kWeights].dims,
                         &gate_up = in[kGateUp].dims, &down = in[kDown].dims;
    for (int32_t i = 0; i < nb_inputs; ++i) {
      if (in[i].dims.nbDims != rank_of(i, nb_inputs))
        return std::string(kInputNames[i]) + " is " + dims_text(in[i].dims);
    }
    const bool fp8 = format_of(nb_inputs) == blob::WeightFormat::Float8RowScaled;
    const int64_t tokens = hidden.d[0], size = hidden.d[1], experts = down.d[0], ffn = ffn_of(gate_up, down);
    const int64_t rows = gated() ? 2 * ffn : ffn;
    // INT4: K-long rows are round_up(K, 32) / 2 packed bytes, with ceil(K / group_size) scales each.
    const auto row = [&](int64_t k) { return int4() ? (k + 31) / 32 * 16 : k; };
    const auto scales_match = [&](const nvinfer1::Dims& scale, int64_t n, int64_t k) {
      return scale.d[0] == experts && scale.d[1] == n && scale.d[2] == (k + group_size_ - 1) / group_size_;
    };
    bool consistent = ids.d[0] == tokens && weights.d[0] == tokens && weights.d[1] == ids.d[1] &&
                      down.d[1] == size && down.d[2] == row(ffn) && gate_up.d[0] == experts && gate_up.d[1] == rows &&
                      gate_up.d[2] == row(size) && (!gated() || rows % 2 == 0);
    if (int4()) {
      consistent = consistent && scales_match(in[kGateUpScale].dims, rows, size) &&
                   scales_match(in[kDownScale].dims, size, ffn);
    }
    if (fp8) {  // a scale per output channel
      const nvinfer1::Dims &gate_up_scale = in[kGateUpScale].dims, &down_scale = in[kDownScale].dims;
      consistent = consistent && gate_up_scale.d[0] == experts && gate_up_scale.d[1] == rows &&
                   down_scale.d[0] == experts && down_scale.d[1] == size;
    }
    if (nb_inputs > kGateUpBias) {
      const nvinfer1::Dims& bias = in[kGateUpBias].dims;
      consistent = consistent && bias.d[0] == experts && bias.d[1] == rows;
    }
    if (nb_inputs > kDownBias) {
      const nvinfer1::Dims& bias = in[kDownBias].dims;
      consistent = consistent && bias.d[0] == experts && bias.d[1] == size;
    }
    if (!consistent) {
      std::string text = "inconsistent shapes (activation " + std::to_string(activation_) + ", N1 = " +
                         (gated() ? "2F" : "F") +
                         (int4() ? ", INT4 group_size " + std::to_string(group_size_) +
                                       ": weights [E, N, round_up(K, 32) / 2], scales [E, N, ceil(K / group_size)]"
                          : fp8  ? std::string(", FP8: weights [E, N, K], scales [E, N]")
                                 : std::string()) + "):";
      for (int32_t i = 0; i < nb_inputs; ++i) text += std::string(" ") + kInputNames[i] + dims_text(in[i].dims);
      return text;
    }
    if (layout_ == GateUpLayout::kBlocked8 && gated() && ffn % 8 != 0)
      return "gate_up_layout blocked8 needs F % 8 == 0; F is " + std::to_string(ffn);
    return "";
  }

  bool create_launcher(DataType type, blob::WeightFormat format, std::string* error) {
    const auto images = moe_images(type, format);
    if (images.empty()) {
      *error = std::string("the blob has no MoE experts kernel image") + format_text(format) + " for " +
               type_name(type) + "; re-export with fused_experts on and this precision";
      return false;
    }
    launcher_ = MoEExpertsLauncher::create(images, error);
    return launcher_ != nullptr;
  }

  int32_t activation_;
  std::string layout_name_;  // as the node wrote it, serialized back verbatim
  GateUpLayout layout_;
  float alpha_, limit_;
  int32_t group_size_;  // > 0: the INT4 form (format_of)
  std::shared_ptr<const KernelPack> images_;
  int32_t nb_inputs_ = kMinInputs;  // as configurePlugin / onShapeChange saw them (enqueue is not told)
  std::unique_ptr<MoEExpertsLauncher> launcher_;
  PluginField fields_[6];
  PluginFieldCollection collection_{};
};

// A float field's value (ONNX attributes arrive as kFLOAT32); NAN for another type.
float float_field(const PluginField& f) {
  if (f.type == PluginFieldType::kFLOAT32) return *static_cast<const float*>(f.data);
  if (f.type == PluginFieldType::kFLOAT64) return static_cast<float>(*static_cast<const double*>(f.data));
  return NAN;
}

class MoEExpertsCreator final : public nvinfer1::IPluginCreatorV3One {
 public:
  // The ONNX node's attributes; kernel_images_id comes from a serialized engine (or the images being parsed).
  MoEExpertsCreator() {
    field_names_[0] = PluginField(kMoEActivationField, nullptr, PluginFieldType::kINT32, 1);
    field_names_[1] = PluginField(kMoELayoutField, nullptr, PluginFieldType::kCHAR, 0);
    field_names_[2] = PluginField(kMoEAlphaField, nullptr, PluginFieldType::kFLOAT32, 1);
    field_names_[3] = PluginField(kMoELimitField, nullptr, PluginFieldType::kFLOAT32, 1);
    field_names_[4] = PluginField(kGroupSizeField, nullptr, PluginFieldType::kINT32, 1);
    collection_.nbFields = 5;
    collection_.fields = field_names_;
  }

  nvinfer1::IPluginV3* createPlugin(const char*, const PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override {
    const PluginField* activation_field = nullptr;
    std::string layout_name;
    float alpha = NAN, limit = NAN;
    const PluginField* id_field = nullptr;
    const PluginField* group_field = nullptr;  // absent in engines and ONNX from before the field: not INT4
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
      const PluginField& f = fc->fields[i];
      if (f.name == nullptr || f.data == nullptr || f.length < 0) continue;
      if (std::strcmp(f.name, kMoEActivationField) == 0) {
        activation_field = &f;
      } else if (std::strcmp(f.name, kGroupSizeField) == 0) {
        group_field = &f;
      } else if (std::strcmp(f.name, kMoELayoutField) == 0 && f.type == PluginFieldType::kCHAR) {
        layout_name.assign(static_cast<const char*>(f.data), static_cast<size_t>(f.length));
        layout_name.erase(layout_name.find_last_not_of('\0') + 1);  // a terminating NUL, where counted
      } else if (std::strcmp(f.name, kMoEAlphaField) == 0 && f.length >= 1) {
        alpha = float_field(f);
      } else if (std::strcmp(f.name, kMoELimitField) == 0 && f.length >= 1) {
        limit = float_field(f);
      } else if (std::strcmp(f.name, kKernelImagesIdField) == 0) {
        id_field = &f;
      }
    }
    GateUpLayout layout{};
    const int64_t activation = activation_field != nullptr ? one_int_field(*activation_field) : -1;
    if (activation < 0 || activation >= kernels::kMoEActivationCount) {
      refuse("field activation must be one int of plugin_names.MOE_ACTIVATIONS (0 to " +
             std::to_string(kernels::kMoEActivationCount - 1) + "), got " +
             (activation_field != nullptr ? field_text(*activation_field) : std::string("none")));
      return nullptr;
    }
    if (!kernels::parse_gate_up_layout(layout_name, &layout)) {
      refuse("field gate_up_layout must be \"concat\", \"interleaved\" or \"blocked8\", got \"" + layout_name + "\"");
      return nullptr;
    }
    if (!std::isfinite(alpha) || !std::isfinite(limit)) {
      refuse("fields alpha and limit must be finite floats (every node writes both), got " + std::to_string(alpha) +
             " and " + std::to_string(limit));
      return nullptr;
    }
    const int32_t group_size = group_size_field(group_field, kMoEExpertsName);
    if (group_size < 0) return nullptr;
    std::shared_ptr<const KernelPack> images = node_kernel_images(id_field, phase, kMoEExpertsName);
    if (images == nullptr) return nullptr;
    return new (std::nothrow) MoEExpertsPlugin(static_cast<int32_t>(activation), layout_name, layout, alpha, limit,
                                               group_size, std::move(images));
  }

  const PluginFieldCollection* getFieldNames() noexcept override { return &collection_; }
  const char* getPluginName() const noexcept override { return kMoEExpertsName; }
  const char* getPluginVersion() const noexcept override { return kMoEExpertsVersion; }
  const char* getPluginNamespace() const noexcept override { return kMoEExpertsNamespace; }

 private:
  PluginField field_names_[5];
  PluginFieldCollection collection_{};
};

}  // namespace

nvinfer1::IPluginCreatorV3One& moe_experts_creator() {
  static MoEExpertsCreator* creator = new MoEExpertsCreator;  // never destroyed: registries outlive statics
  return *creator;
}

bool register_moe_experts_plugin(nvinfer1::IPluginRegistry& registry, std::string* error) {
  return register_creator_once(registry, moe_experts_creator(), error);
}

}  // namespace et_trt
