// TensorRT plugin for the ONNX op et_trt::GroupedMM (contract 4): name
// "GroupedMM", namespace "et_trt", version "1". Output [rows, N] in a's dtype.
// Two forms, told apart by the input count:
//   dense (3 inputs): a [rows, K], b [G, K, N] (or [G, N, K] with trans_b) in
//     a's dtype, offs int32 [G];
//   FP8 (4 inputs, trans_b only): a [rows, K], b kFP8 e4m3 [G, N, K], offs
//     int32 [G], b_scale kFLOAT [G, N]. The launcher quantizes a per row into
//     the plugin's workspace (GroupedMMLauncher::fp8_workspace_bytes at the
//     profile's max rows), from the blob's Float8RowScaled images;
//   INT4 (4 inputs, field group_size 32, 64 or 128, trans_b only): a [rows, K], b kINT8 (packed INT4 bytes)
//     [G, N, round_up(K, 32) / 2], offs int32 [G], b_scale kBF16 [G, N, ceil(K / group_size)]
//     (et_trt_backend/int4_weights.py), from the blob's Int4GroupScaled images.
// Launched through et_trt::kernels::GroupedMMLauncher.
//
// Fields (schema.fbs, table Engine): `trans_b` (kINT32, 1) and
// `kernel_images_id` (kUNKNOWN, 32 bytes): the sha256 naming the blob's
// kernel images, which the plugin resolves in the process's registry
// (kernel_images.h). So a serialized engine carries one reference, not the
// images; it loads where the blob it was built from is registered first.
//
// Compiled into libet_trt_runtime.so (the delegate registers the creator) and
// into libet_trt_plugin.so (plugin_library.cc: a plugin library any TensorRT or
// TensorRT for RTX process can load).
#pragma once

#include <NvInfer.h>

#include <memory>
#include <string>

#include "kernel_images.h"

namespace et_trt {

constexpr char kGroupedMMName[] = "GroupedMM";
constexpr char kGroupedMMNamespace[] = "et_trt";
constexpr char kGroupedMMVersion[] = "1";
constexpr char kTransBField[] = "trans_b";
constexpr char kKernelImagesIdField[] = "kernel_images_id";
// What a node's input a is (et_trt_backend/plugin_names.py): kActivationNone, the activations; kActivationSwiGLU
// (FP8 form only), a gate+up output [rows, 2K] whose SwiGLU silu(a[:, :K]) * a[:, K:] the GEMM multiplies.
constexpr char kActivationField[] = "activation";
constexpr int32_t kActivationNone = 0;
constexpr int32_t kActivationSwiGLU = 1;
// The INT4 form's scale groups' size along K (plugin_names.INT4_GROUP_SIZE_ATTRIBUTE); 0 (or absent): not INT4.
// MoEExperts has the same field.
constexpr char kGroupSizeField[] = "group_size";

// The creator, one per process (lives as long as the process, like a registry).
nvinfer1::IPluginCreatorV3One& grouped_mm_creator();

// Registers the creator with TensorRT's registry (once per process).
bool register_grouped_mm_plugin(nvinfer1::IPluginRegistry& registry, std::string* error);

// Where the plugin's messages go: TensorRT's logger of the process (the
// runtime's, or the one a plugin library is handed); stderr until set.
void set_grouped_mm_logger(nvinfer1::ILogger* logger);

// The last refusal of the creator on this thread (e.g. an engine naming
// kernel images no loaded blob holds), then cleared; empty if none.
std::string take_grouped_mm_error();

// While alive, GroupedMM plugins created on this thread from an ONNX node
// (which carries only trans_b and activation) take `images`. Whoever parses a blob's ONNX
// holds one around the parse.
class KernelImagesForParsing {
 public:
  explicit KernelImagesForParsing(std::shared_ptr<const KernelPack> images);
  ~KernelImagesForParsing();
  KernelImagesForParsing(const KernelImagesForParsing&) = delete;
  KernelImagesForParsing& operator=(const KernelImagesForParsing&) = delete;

 private:
  std::shared_ptr<const KernelPack> previous_;
};

// The images plugins created from ONNX on this thread take (nullptr: none).
void set_parsing_kernel_images(std::shared_ptr<const KernelPack> images);

// What the MoEExperts plugin (moe_experts_plugin.cc) shares with this one: the logger set above, the refusal
// take_grouped_mm_error returns, the int fields ONNX attributes arrive as, and where a new node's images come
// from.
void log_plugin_message(nvinfer1::ILogger::Severity severity, const std::string& text);
void refuse_plugin(const std::string& text);  // logged as an error and kept for take_grouped_mm_error
// An int field's value (ONNX attributes arrive as kINT32 or kINT64); `fallback` for another type.
int64_t int_field(const nvinfer1::PluginField& field, int64_t fallback);
// The value of a field that must hold one integer; -1 (never a valid value here) otherwise.
int64_t one_int_field(const nvinfer1::PluginField& field);
// The group_size field's value (0 where absent); -1, the refusal logged naming `plugin`, where it is not 0, 32, 64 or
// 128.
int32_t group_size_field(const nvinfer1::PluginField* field, const char* plugin);
// "[4, 48, 64]": runtime dimensions as messages write them.
std::string dims_text(const nvinfer1::Dims& dims);
// A field as a refusal names it: "INT32 [2]", "FLOAT32 [1.5]".
std::string field_text(const nvinfer1::PluginField& field);
// The images a plugin created now takes: those its serialized kernel_images_id field names (`id_field`, from an
// engine), else the blob's being parsed on this thread. nullptr, the refusal logged (naming `plugin`), otherwise.
std::shared_ptr<const KernelPack> node_kernel_images(const nvinfer1::PluginField* id_field,
                                                     nvinfer1::TensorRTPhase phase, const char* plugin);
// Registers `creator` with `registry`, once per registry (a second call is a no-op; so is a first where this
// library, loaded as a plugin library, registered it already); false and *error where another library's creator of
// the same name is registered.
bool register_creator_once(nvinfer1::IPluginRegistry& registry, nvinfer1::IPluginCreatorV3One& creator,
                           std::string* error);
// The 1-byte field types a 32-byte id may arrive as: kUNKNOWN (our engines) or, from an ONNX attribute, kINT8 /
// kCHAR.
bool is_byte_field(nvinfer1::PluginFieldType type);

}  // namespace et_trt
