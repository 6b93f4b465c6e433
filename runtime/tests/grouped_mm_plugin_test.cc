// The GroupedMM plugin's build phase, as TensorRT calls it (no TensorRT
// library: its interfaces are header-only): which forms it takes, what it
// refuses and says, and the workspace the FP8 form asks for.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "grouped_mm_plugin.h"
#include "kernel_images.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;

// Keeps what the plugin logs.
class Messages final : public nvinfer1::ILogger {
 public:
  void log(Severity, const char* message) noexcept override { text += std::string(message) + "\n"; }
  std::string text;
};

// A blob with bf16 images: an FP8 GEMM and its row quantization ([G, N, K]),
// and a dense GEMM of each layout.
struct Blob {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint8_t>> images;
};

Blob fp8_blob() {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<uint8_t> sha256(32, 0);  // the pack reads the bytes it is given, not the record's digest
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels;
  struct Record {
    const char* variant;
    bool trans_b;
    blob::WeightFormat format;
  };
  for (const Record& r : {Record{"any", true, blob::WeightFormat::Float8RowScaled},
                          Record{"quantize_rows", true, blob::WeightFormat::Float8RowScaled},
                          Record{"any", true, blob::WeightFormat::Dense}, Record{"any", false, blob::WeightFormat::Dense},
                          Record{"any", true, blob::WeightFormat::Int4GroupScaled}}) {
    auto image = blob::CreateNamedDataDirect(fbb, "et_trt/00", 1, &sha256);
    kernels.push_back(blob::CreateKernelImageDirect(fbb, r.variant, r.variant, r.trans_b, "sm_89",
                                                    blob::ImageFormat::Cubin, image, r.variant, blob::DType::BFloat16, 4,
                                                    0, 0, 1, 0, 64, 64, 64, false, "8.4", r.format));
  }
  fbb.Finish(blob::CreateBlobDirect(fbb, "experts", 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, &kernels),
             blob::BlobIdentifier());
  return {std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()),
          {{1}, {2}, {3}, {4}, {5}}};
}

class GroupedMMPluginBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    const Blob b = fp8_blob();
    std::vector<NamedBytes> images;
    for (const auto& bytes : b.images) images.push_back({bytes.data(), bytes.size(), nullptr});
    pack_ = std::make_shared<KernelPack>(*blob::GetBlob(b.bytes.data()), images);
    set_grouped_mm_logger(&messages_);
  }
  void TearDown() override { set_grouped_mm_logger(nullptr); }

  // A plugin as the parser creates it from a node with this trans_b (and activation and group size, where given).
  std::unique_ptr<nvinfer1::IPluginV3> plugin(int32_t trans_b, const int64_t* activation = nullptr,
                                              const int64_t* group_size = nullptr) {
    KernelImagesForParsing parsing(pack_);
    std::vector<nvinfer1::PluginField> field{
        nvinfer1::PluginField(kTransBField, &trans_b, nvinfer1::PluginFieldType::kINT32, 1)};
    if (activation != nullptr) field.emplace_back(kActivationField, activation, nvinfer1::PluginFieldType::kINT64, 1);
    if (group_size != nullptr) field.emplace_back(kGroupSizeField, group_size, nvinfer1::PluginFieldType::kINT64, 1);
    nvinfer1::PluginFieldCollection fields{static_cast<int32_t>(field.size()), field.data()};
    return std::unique_ptr<nvinfer1::IPluginV3>(
        grouped_mm_creator().createPlugin("experts", &fields, nvinfer1::TensorRTPhase::kBUILD));
  }

  static nvinfer1::IPluginV3OneBuild* build(nvinfer1::IPluginV3& p) {
    return static_cast<nvinfer1::IPluginV3OneBuild*>(p.getCapabilityInterface(nvinfer1::PluginCapabilityType::kBUILD));
  }

  // getOutputDataTypes' return code; `out` is the output type on success.
  static int32_t output_type(nvinfer1::IPluginV3& p, std::vector<DataType> inputs, DataType* out) {
    return build(p)->getOutputDataTypes(out, 1, inputs.data(), static_cast<int32_t>(inputs.size()));
  }

  std::shared_ptr<const KernelPack> pack_;
  Messages messages_;
};

TEST_F(GroupedMMPluginBuild, TakesTheFp8FormAndTheDenseForm) {
  auto p = plugin(1);
  ASSERT_NE(p, nullptr);
  DataType out = DataType::kFLOAT;
  EXPECT_EQ(output_type(*p, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kFLOAT}, &out), 0);
  EXPECT_EQ(out, DataType::kBF16);
  out = DataType::kFLOAT;
  EXPECT_EQ(output_type(*p, {DataType::kBF16, DataType::kBF16, DataType::kINT32}, &out), 0);
  EXPECT_EQ(out, DataType::kBF16);
  EXPECT_EQ(messages_.text, "");
}

TEST_F(GroupedMMPluginBuild, RefusesMalformedFp8FormsSayingWhy) {
  struct Case {
    int32_t trans_b;
    std::vector<DataType> inputs;
    const char* message;
  };
  const std::vector<Case> cases = {
      {1, {DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kFLOAT},
       "the FP8 form's b (input 1) must be FLOAT8E4M3FN (TensorRT FP8) [G, N, K]; it is kINT8"},
      {1, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kHALF},
       "the FP8 form's b_scale (input 3) must be float32 [G, N]; it is kHALF"},
      {1, {DataType::kHALF, DataType::kFP8, DataType::kINT32, DataType::kFLOAT},
       "the blob has no fp16 FP8 kernel image for trans_b=1 (it has bf16)"},
      {0, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kFLOAT},
       "the FP8 form (4 inputs) needs trans_b=1: its weights are [G, N, K]; the node has trans_b=0"},
      {1, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kFLOAT, DataType::kFLOAT},
       "GroupedMM takes 3 inputs (a, b, offs) or 4 (a, b FP8, offs, b_scale); the node has 5"},
  };
  for (const Case& c : cases) {
    messages_.text.clear();
    auto p = plugin(c.trans_b);
    ASSERT_NE(p, nullptr);
    DataType out = DataType::kFLOAT;
    EXPECT_EQ(output_type(*p, c.inputs, &out), -1) << c.message;
    EXPECT_NE(messages_.text.find(c.message), std::string::npos) << messages_.text;
  }
}

TEST_F(GroupedMMPluginBuild, OffersTensorRTOnlyTheFp8FormsTypes) {
  auto p = plugin(1);
  ASSERT_NE(p, nullptr);
  std::vector<nvinfer1::DynamicPluginTensorDesc> io(5);
  const DataType types[] = {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kFLOAT, DataType::kBF16};
  for (int i = 0; i < 5; ++i) {
    io[i].desc.type = types[i];
    io[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
  }
  for (int pos = 0; pos < 5; ++pos) EXPECT_TRUE(build(*p)->supportsFormatCombination(pos, io.data(), 4, 1)) << pos;
  io[1].desc.type = DataType::kINT8;  // e4m3 bits typed INT8 are not taken for FP8
  EXPECT_FALSE(build(*p)->supportsFormatCombination(1, io.data(), 4, 1));
  io[3].desc.type = DataType::kHALF;
  EXPECT_FALSE(build(*p)->supportsFormatCombination(3, io.data(), 4, 1));
  io[0].desc.type = DataType::kHALF;  // no fp16 FP8 images
  EXPECT_FALSE(build(*p)->supportsFormatCombination(0, io.data(), 4, 1));
}

TEST_F(GroupedMMPluginBuild, TakesTheInt4FormOfItsInt4Images) {
  const int64_t group = 128;
  auto p = plugin(1, nullptr, &group);
  ASSERT_NE(p, nullptr) << messages_.text;
  DataType out = DataType::kFLOAT;
  EXPECT_EQ(output_type(*p, {DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kBF16}, &out), 0);
  EXPECT_EQ(out, DataType::kBF16);
  EXPECT_EQ(messages_.text, "");
  std::vector<nvinfer1::DynamicPluginTensorDesc> io(5);
  const DataType types[] = {DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kBF16, DataType::kBF16};
  for (int i = 0; i < 5; ++i) {
    io[i].desc.type = types[i];
    io[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
  }
  for (int pos = 0; pos < 5; ++pos) EXPECT_TRUE(build(*p)->supportsFormatCombination(pos, io.data(), 4, 1)) << pos;
  io[1].desc.type = DataType::kFP8;  // the FP8 form's weights are not this node's
  EXPECT_FALSE(build(*p)->supportsFormatCombination(1, io.data(), 4, 1));
  std::vector<nvinfer1::DynamicPluginTensorDesc> in(4), no(1);
  in[0].max = nvinfer1::Dims2(1000, 64);
  EXPECT_EQ(build(*p)->getWorkspaceSize(in.data(), 4, no.data(), 1), 0u);  // INT4 launches need no workspace
}

TEST_F(GroupedMMPluginBuild, RefusesMalformedInt4FormsSayingWhy) {
  const int64_t group = 64, odd = 16;
  struct Case {
    int32_t trans_b;
    std::vector<DataType> inputs;
    const char* message;
  };
  const std::vector<Case> cases = {
      {1, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kBF16},
       "the INT4 form's b (input 1) must be INT8 (packed INT4 bytes) [G, N, round_up(K, 32) / 2]; it is kFP8"},
      {1, {DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kFLOAT},
       "the INT4 form's b_scale (input 3) must be bfloat16 [G, N, groups]; it is kFLOAT"},
      {0, {DataType::kBF16, DataType::kINT8, DataType::kINT32, DataType::kBF16},
       "the INT4 form needs trans_b=1: its weights are [G, N, K]; the node has trans_b=0"},
      {1, {DataType::kBF16, DataType::kBF16, DataType::kINT32},
       "group_size=64 (the INT4 form) needs 4 inputs (a, b, offs, b_scale); the node has 3"},
      {1, {DataType::kHALF, DataType::kINT8, DataType::kINT32, DataType::kBF16},
       "the blob has no fp16 INT4 kernel image for trans_b=1 (it has bf16)"},
  };
  for (const Case& c : cases) {
    messages_.text.clear();
    auto p = plugin(c.trans_b, nullptr, &group);
    ASSERT_NE(p, nullptr);
    DataType out = DataType::kFLOAT;
    EXPECT_EQ(output_type(*p, c.inputs, &out), -1) << c.message;
    EXPECT_NE(messages_.text.find(c.message), std::string::npos) << messages_.text;
  }
  messages_.text.clear();
  EXPECT_EQ(plugin(1, nullptr, &odd), nullptr);
  EXPECT_NE(messages_.text.find("GroupedMM plugin: field group_size must be one integer: 0 (weights not INT4) or the "
                                "INT4 scale groups' size 32, 64 or 128; got INT64 [16]"),
            std::string::npos)
      << messages_.text;
}

TEST_F(GroupedMMPluginBuild, Fp8WorkspaceIsTheLaunchersAtTheProfilesMaxRowsPlusAlignment) {
  EXPECT_EQ(kernels::GroupedMMLauncher::fp8_workspace_bytes(1000, 64), 64000u + 4000u);  // 64000 is 256-aligned
  EXPECT_EQ(kernels::GroupedMMLauncher::fp8_workspace_bytes(3, 5), 256u + 12u);
  auto p = plugin(1);
  ASSERT_NE(p, nullptr);
  std::vector<nvinfer1::DynamicPluginTensorDesc> in(4), out(1);
  in[0].min = nvinfer1::Dims2(1, 64);
  in[0].opt = nvinfer1::Dims2(16, 64);
  in[0].max = nvinfer1::Dims2(1000, 64);
  in[1].max = nvinfer1::Dims3(4, 48, 64);  // b [G, N, K]
  EXPECT_EQ(build(*p)->getWorkspaceSize(in.data(), 4, out.data(), 1),
            kernels::GroupedMMLauncher::fp8_workspace_bytes(1000, 64) + 255);
  EXPECT_EQ(build(*p)->getWorkspaceSize(in.data(), 3, out.data(), 1), 0u);  // the dense form needs none
  // A gate+up output as a ([rows, 2K]): the quantized rows are the GEMM's, K of b.
  const int64_t swiglu = kActivationSwiGLU;
  auto fused = plugin(1, &swiglu);
  ASSERT_NE(fused, nullptr);
  in[0].max = nvinfer1::Dims2(1000, 128);
  EXPECT_EQ(build(*fused)->getWorkspaceSize(in.data(), 4, out.data(), 1),
            kernels::GroupedMMLauncher::fp8_workspace_bytes(1000, 64) + 255);
}

TEST_F(GroupedMMPluginBuild, TakesAGateUpOutputInTheFp8FormOnly) {
  const int64_t swiglu = kActivationSwiGLU, unknown = 2;
  auto fused = plugin(1, &swiglu);
  ASSERT_NE(fused, nullptr);
  DataType out = DataType::kFLOAT;
  EXPECT_EQ(output_type(*fused, {DataType::kBF16, DataType::kFP8, DataType::kINT32, DataType::kFLOAT}, &out), 0);
  EXPECT_EQ(out, DataType::kBF16);
  EXPECT_EQ(output_type(*fused, {DataType::kBF16, DataType::kBF16, DataType::kINT32}, &out), -1);
  EXPECT_NE(messages_.text.find("activation=1 (a gate+up output as a) is the FP8 form's only (4 inputs); the node "
                                "has 3"), std::string::npos) << messages_.text;
  // Serialized with the plugin, so that an engine's plugin takes the same input.
  const nvinfer1::PluginFieldCollection* fields =
      static_cast<nvinfer1::IPluginV3OneRuntime*>(fused->getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME))
          ->getFieldsToSerialize();
  bool serialized = false;
  for (int32_t i = 0; i < fields->nbFields; ++i)
    if (std::string(fields->fields[i].name) == kActivationField)
      serialized = *static_cast<const int32_t*>(fields->fields[i].data) == kActivationSwiGLU;
  EXPECT_TRUE(serialized);
  messages_.text.clear();
  EXPECT_EQ(plugin(1, &unknown), nullptr);
  EXPECT_NE(messages_.text.find("field activation must be 0 (a holds the activations) or 1 (a gate+up output, its "
                                "SwiGLU), got INT64 [2]"), std::string::npos) << messages_.text;
}

TEST_F(GroupedMMPluginBuild, RefusesKernelImagesItCannotResolve) {
  const int32_t trans_b = 1;
  const std::vector<uint8_t> unknown(32, 0xab), short_id(31, 0);
  struct Case {
    const std::vector<uint8_t>* id;  // none: a node parsed on a thread given no images
    nvinfer1::TensorRTPhase phase;
    std::string message;
  };
  std::string unknown_hex;
  for (size_t i = 0; i < unknown.size(); ++i) unknown_hex += "ab";
  for (const Case& c : {Case{&unknown, nvinfer1::TensorRTPhase::kRUNTIME,
                             "loading an engine: the engine's kernel images " + unknown_hex + " are not loaded"},
                        Case{&short_id, nvinfer1::TensorRTPhase::kRUNTIME,
                             "field kernel_images_id must be 32 bytes (a sha256), got 31 elements"},
                        Case{nullptr, nvinfer1::TensorRTPhase::kBUILD,
                             "building: no kernel images: a GroupedMM node from ONNX takes the images of the blob "
                             "being parsed, and none was given"}}) {
    messages_.text.clear();
    nvinfer1::PluginField field[2] = {
        nvinfer1::PluginField(kTransBField, &trans_b, nvinfer1::PluginFieldType::kINT32, 1),
        nvinfer1::PluginField(kKernelImagesIdField, c.id != nullptr ? c.id->data() : nullptr,
                              nvinfer1::PluginFieldType::kUNKNOWN,
                              c.id != nullptr ? static_cast<int32_t>(c.id->size()) : 0)};
    nvinfer1::PluginFieldCollection fields{c.id != nullptr ? 2 : 1, field};
    EXPECT_EQ(grouped_mm_creator().createPlugin("experts", &fields, c.phase), nullptr);
    EXPECT_NE(messages_.text.find(c.message), std::string::npos) << messages_.text;
  }
}

TEST_F(GroupedMMPluginBuild, RefusesATransBThatIsNotOneIntegerZeroOrOne) {
  KernelImagesForParsing parsing(pack_);
  const float half = 1.5f;
  const int32_t two = 2;
  struct Case {
    nvinfer1::PluginField field;
    int32_t count;
    const char* message;
  };
  for (const Case& c : {Case{nvinfer1::PluginField(kTransBField, &half, nvinfer1::PluginFieldType::kFLOAT32, 1), 1,
                             "field trans_b must be one integer, 0 or 1; got FLOAT32 [1.5]"},
                        Case{nvinfer1::PluginField(kTransBField, &two, nvinfer1::PluginFieldType::kINT32, 1), 1,
                             "field trans_b must be one integer, 0 or 1; got INT32 [2]"},
                        Case{nvinfer1::PluginField(kTransBField, &two, nvinfer1::PluginFieldType::kINT32, 1), 0,
                             "field trans_b is missing"}}) {
    messages_.text.clear();
    nvinfer1::PluginFieldCollection fields{c.count, &c.field};
    EXPECT_EQ(grouped_mm_creator().createPlugin("experts", &fields, nvinfer1::TensorRTPhase::kBUILD), nullptr);
    EXPECT_NE(messages_.text.find(c.message), std::string::npos) << messages_.text;
  }
}

}  // namespace
}  // namespace et_trt
