// The MoEExperts plugin's build phase, as TensorRT calls it (no TensorRT library: its interfaces are
// header-only): the fields it takes from an ONNX node, what it refuses and says, the types and shapes it
// offers, and the fields it serializes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "moe_experts_plugin.h"

namespace et_trt {
namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

class Messages final : public nvinfer1::ILogger {
 public:
  void log(Severity, const char* message) noexcept override { text += std::string(message) + "\n"; }
  std::string text;
};

// A blob with the bf16 images of the MoE kernels (names as moe_aot writes them), their INT4 and FP8 builds, and one
// GroupedMM image, which the MoEExperts plugin ignores.
constexpr int kImages = 10;
std::vector<uint8_t> moe_blob() {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<uint8_t> sha256(32, 0);
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels;
  struct Record {
    const char* name;
    blob::WeightFormat format;
  };
  for (const Record& r : {Record{"moe_route", blob::WeightFormat::Dense},
                          Record{"moe_gate_up_gated", blob::WeightFormat::Dense},
                          Record{"moe_down", blob::WeightFormat::Dense}, Record{"moe_combine", blob::WeightFormat::Dense},
                          Record{"grouped_mm_tile_nk", blob::WeightFormat::Dense},
                          Record{"moe_gate_up_gated", blob::WeightFormat::Int4GroupScaled},
                          Record{"moe_down", blob::WeightFormat::Int4GroupScaled},
                          Record{"moe_route_quantize", blob::WeightFormat::Float8RowScaled},
                          Record{"moe_gate_up_gated", blob::WeightFormat::Float8RowScaled},
                          Record{"moe_down", blob::WeightFormat::Float8RowScaled}}) {
    auto image = blob::CreateNamedDataDirect(fbb, "et_trt/00", 1, &sha256);
    kernels.push_back(blob::CreateKernelImageDirect(fbb, r.name, "any", true, "sm_89", blob::ImageFormat::Cubin, image,
                                                    r.name, blob::DType::BFloat16, 4, 0, 0, 1, 0, 0, 64, 64, false,
                                                    "8.4", r.format));
  }
  fbb.Finish(blob::CreateBlobDirect(fbb, "experts", 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, &kernels),
             blob::BlobIdentifier());
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

// The fields of an ONNX MoEExperts node, each settable.
struct Node {
  int64_t activation = 0;  // swiglu
  std::string layout = "blocked8";
  float alpha = 1.702f, limit = 7.0f;
  bool with_limit = true;
  int64_t group_size = 0;  // written where nonzero: the INT4 form
};

class MoEExpertsPluginBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<uint8_t> bytes = moe_blob();
    const std::vector<uint8_t> image{1};
    std::vector<NamedBytes> images(kImages, NamedBytes{image.data(), image.size(), nullptr});
    pack_ = std::make_shared<KernelPack>(*blob::GetBlob(bytes.data()), images);
    set_grouped_mm_logger(&messages_);
  }
  void TearDown() override { set_grouped_mm_logger(nullptr); }

  std::unique_ptr<nvinfer1::IPluginV3> plugin(const Node& n) {
    KernelImagesForParsing parsing(pack_);
    PluginField fields[5] = {
        PluginField("activation", &n.activation, PluginFieldType::kINT64, 1),
        PluginField("gate_up_layout", n.layout.data(), PluginFieldType::kCHAR, static_cast<int32_t>(n.layout.size())),
        PluginField("alpha", &n.alpha, PluginFieldType::kFLOAT32, 1),
        PluginField("group_size", &n.group_size, PluginFieldType::kINT64, 1),
        PluginField("limit", &n.limit, PluginFieldType::kFLOAT32, 1)};
    nvinfer1::PluginFieldCollection collection{n.with_limit ? 5 : 4, fields};
    return std::unique_ptr<nvinfer1::IPluginV3>(
        moe_experts_creator().createPlugin("experts", &collection, nvinfer1::TensorRTPhase::kBUILD));
  }

  static nvinfer1::IPluginV3OneBuild* build(nvinfer1::IPluginV3& p) {
    return static_cast<nvinfer1::IPluginV3OneBuild*>(p.getCapabilityInterface(nvinfer1::PluginCapabilityType::kBUILD));
  }

  static int32_t output_type(nvinfer1::IPluginV3& p, std::vector<DataType> inputs, DataType* out) {
    return build(p)->getOutputDataTypes(out, 1, inputs.data(), static_cast<int32_t>(inputs.size()));
  }

  // The plugin of node `n`, which takes a 9-input node of these input `types` (hidden's kBF16 out) and offers each
  // position its type; `io` holds those 9 and the output's.
  std::unique_ptr<nvinfer1::IPluginV3> quantized_plugin(const Node& n, const std::vector<DataType>& types,
                                                        std::vector<nvinfer1::DynamicPluginTensorDesc>* io) {
    auto p = plugin(n);
    EXPECT_NE(p, nullptr) << messages_.text;
    if (p == nullptr) return p;
    DataType out = DataType::kFLOAT;
    EXPECT_EQ(output_type(*p, types, &out), 0);
    EXPECT_EQ(out, DataType::kBF16);
    EXPECT_EQ(messages_.text, "");
    io->assign(10, nvinfer1::DynamicPluginTensorDesc{});
    for (int i = 0; i < 10; ++i) {
      (*io)[i].desc.type = i < 9 ? types[i] : DataType::kBF16;
      (*io)[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
    }
    for (int pos = 0; pos < 10; ++pos) EXPECT_TRUE(build(*p)->supportsFormatCombination(pos, io->data(), 9, 1)) << pos;
    return p;
  }

  struct Refusal {
    std::vector<DataType> inputs;
    const char* message;  // what the plugin logs, after "MoEExperts plugin: "
  };

  // Each node of `n`'s fields with a refusal's input types is refused, saying why.
  void expect_refused(const Node& n, const std::vector<Refusal>& refusals) {
    for (const Refusal& r : refusals) {
      messages_.text.clear();
      auto p = plugin(n);
      ASSERT_NE(p, nullptr);
      DataType out = DataType::kFLOAT;
      EXPECT_EQ(output_type(*p, r.inputs, &out), -1) << r.message;
      EXPECT_NE(messages_.text.find(std::string("MoEExperts plugin: ") + r.message), std::string::npos)
          << messages_.text;
    }
  }

  std::shared_ptr<const KernelPack> pack_;
  Messages messages_;
};

const std::vector<DataType> kBf16Node = {DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kBF16,
                                         DataType::kBF16};

TEST_F(MoEExpertsPluginBuild, TakesANodeOfItsImagesType) {
  auto p = plugin(Node{});
  ASSERT_NE(p, nullptr) << messages_.text;
  DataType out = DataType::kFLOAT;
  EXPECT_EQ(output_type(*p, kBf16Node, &out), 0);
  EXPECT_EQ(out, DataType::kBF16);
  std::vector<DataType> biased = kBf16Node;
  biased.insert(biased.end(), {DataType::kBF16, DataType::kBF16});
  biased[2] = DataType::kBF16;  // routing weights in hidden's type
  EXPECT_EQ(output_type(*p, biased, &out), 0);
  EXPECT_EQ(messages_.text, "");
}

TEST_F(MoEExpertsPluginBuild, RefusesTypesSayingWhy) {
  expect_refused(Node{}, {
      {{DataType::kHALF, DataType::kINT32, DataType::kFLOAT, DataType::kHALF, DataType::kHALF},
       "the blob has no MoE experts kernel image for hidden's kHALF (it has bf16)"},
      {{DataType::kBF16, DataType::kINT64, DataType::kFLOAT, DataType::kBF16, DataType::kBF16},
       "topk_ids must be kINT32; it is kINT64"},
      {{DataType::kBF16, DataType::kINT32, DataType::kHALF, DataType::kBF16, DataType::kBF16},
       "topk_weights must be kFLOAT or hidden's kBF16; it is kHALF"},
      {{DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kBF16, DataType::kHALF},
       "w_down must be hidden's kBF16; it is kHALF"},
      {{DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kBF16},
       "MoEExperts takes 5 inputs (hidden, topk_ids, topk_weights, w_gate_up, w_down) and up to 2 biases, or 9 with "
       "FP8 weights (both biases, then w_gate_up_scale, w_down_scale); the node has 4"},
  });
}

TEST_F(MoEExpertsPluginBuild, RefusesBadFieldsSayingWhy) {
  struct Case {
    Node node;
    const char* message;
  };
  Node no_limit;
  no_limit.with_limit = false;
  Node bad_activation;
  bad_activation.activation = 8;
  Node bad_layout;
  bad_layout.layout = "rows";
  const std::vector<Case> cases = {
      {bad_activation, "field activation must be one int of plugin_names.MOE_ACTIVATIONS (0 to 7), got INT64 [8]"},
      {bad_layout, "field gate_up_layout must be \"concat\", \"interleaved\" or \"blocked8\", got \"rows\""},
      {no_limit, "fields alpha and limit must be finite floats (every node writes both)"},
  };
  for (const Case& c : cases) {
    messages_.text.clear();
    EXPECT_EQ(plugin(c.node), nullptr) << c.message;
    EXPECT_NE(messages_.text.find(c.message), std::string::npos) << messages_.text;
    EXPECT_NE(take_grouped_mm_error().find(c.message), std::string::npos);
  }
}

TEST_F(MoEExpertsPluginBuild, OffersLinearFormatsOfTheNodesTypes) {
  auto p = plugin(Node{});
  ASSERT_NE(p, nullptr);
  std::vector<nvinfer1::DynamicPluginTensorDesc> io(6);
  const DataType types[] = {DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kBF16, DataType::kBF16,
                            DataType::kBF16};
  for (int i = 0; i < 6; ++i) {
    io[i].desc.type = types[i];
    io[i].desc.format = nvinfer1::TensorFormat::kLINEAR;
  }
  for (int pos = 0; pos < 6; ++pos) EXPECT_TRUE(build(*p)->supportsFormatCombination(pos, io.data(), 5, 1)) << pos;
  io[1].desc.type = DataType::kINT64;
  EXPECT_FALSE(build(*p)->supportsFormatCombination(1, io.data(), 5, 1));
  io[0].desc.type = DataType::kHALF;  // no fp16 images in the blob
  EXPECT_FALSE(build(*p)->supportsFormatCombination(0, io.data(), 5, 1));
}

TEST_F(MoEExpertsPluginBuild, SerializesEveryFieldAndTheImagesId) {
  Node gptoss;
  gptoss.activation = 3;
  gptoss.layout = "interleaved";
  gptoss.alpha = 1.703125f;
  auto p = plugin(gptoss);
  ASSERT_NE(p, nullptr);
  auto* runtime =
      static_cast<nvinfer1::IPluginV3OneRuntime*>(p->getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME));
  const nvinfer1::PluginFieldCollection* fields = runtime->getFieldsToSerialize();
  ASSERT_EQ(fields->nbFields, 6);
  EXPECT_STREQ(fields->fields[0].name, "activation");
  EXPECT_EQ(*static_cast<const int32_t*>(fields->fields[0].data), 3);
  EXPECT_EQ(std::string(static_cast<const char*>(fields->fields[1].data), fields->fields[1].length), "interleaved");
  EXPECT_EQ(*static_cast<const float*>(fields->fields[2].data), 1.703125f);
  EXPECT_EQ(*static_cast<const float*>(fields->fields[3].data), 7.0f);
  EXPECT_STREQ(fields->fields[4].name, kKernelImagesIdField);
  ASSERT_EQ(fields->fields[4].length, 32);
  EXPECT_EQ(std::memcmp(fields->fields[4].data, pack_->id().data(), 32), 0);
  EXPECT_STREQ(fields->fields[5].name, kGroupSizeField);
  EXPECT_EQ(*static_cast<const int32_t*>(fields->fields[5].data), 0);
}

// The INT4 form: packed weights (INT8 bytes), both biases, and the weights' bf16 group scales.
const std::vector<DataType> kInt4Node = {DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kINT8,
                                         DataType::kINT8, DataType::kBF16,  DataType::kBF16,  DataType::kBF16,
                                         DataType::kBF16};

TEST_F(MoEExpertsPluginBuild, TakesTheInt4FormOfItsInt4Images) {
  Node int4;
  int4.group_size = 128;
  std::vector<nvinfer1::DynamicPluginTensorDesc> io;
  auto p = quantized_plugin(int4, kInt4Node, &io);
  ASSERT_NE(p, nullptr);
  io[3].desc.type = DataType::kBF16;  // dense weights are not this node's
  EXPECT_FALSE(build(*p)->supportsFormatCombination(3, io.data(), 9, 1));
  auto* runtime =
      static_cast<nvinfer1::IPluginV3OneRuntime*>(p->getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME));
  EXPECT_EQ(*static_cast<const int32_t*>(runtime->getFieldsToSerialize()->fields[5].data), 128);
}

TEST_F(MoEExpertsPluginBuild, RefusesMalformedInt4FormsSayingWhy) {
  Node int4;
  int4.group_size = 64;
  std::vector<DataType> dense_weights = kInt4Node, float_scales = kInt4Node, half = kInt4Node;
  dense_weights[3] = DataType::kBF16;
  float_scales[8] = DataType::kFLOAT;
  for (int i : {0, 5, 6}) half[i] = DataType::kHALF;
  expect_refused(int4, {
      {dense_weights, "w_gate_up must be kINT8 (packed INT4 bytes); it is kBF16"},
      {float_scales, "w_down_scale must be kBF16 (INT4 group scales); it is kFLOAT"},
      {half, "the blob has no MoE experts kernel image of INT4 weights for hidden's kHALF (it has bf16)"},
      {kBf16Node, "group_size=64 (INT4 weights) takes 9 inputs (hidden, topk_ids, topk_weights, w_gate_up, w_down, "
                  "b_gate_up, b_down, w_gate_up_scale, w_down_scale); the node has 5"},
  });
  Node odd;
  odd.group_size = 48;
  messages_.text.clear();
  EXPECT_EQ(plugin(odd), nullptr);
  EXPECT_NE(messages_.text.find("MoEExperts plugin: field group_size must be one integer: 0 (weights not INT4) or "
                                "the INT4 scale groups' size 32, 64 or 128; got INT64 [48]"),
            std::string::npos)
      << messages_.text;
}

// The FP8 form: e4m3 weights, both biases, and the weights' float32 scales per output channel; group_size 0.
const std::vector<DataType> kFp8Node = {DataType::kBF16, DataType::kINT32, DataType::kFLOAT, DataType::kFP8,
                                        DataType::kFP8,  DataType::kBF16,  DataType::kBF16,  DataType::kFLOAT,
                                        DataType::kFLOAT};

nvinfer1::Dims dims(std::initializer_list<int64_t> values) {
  nvinfer1::Dims d{};
  d.nbDims = static_cast<int32_t>(values.size());
  int i = 0;
  for (int64_t v : values) d.d[i++] = v;
  return d;
}

TEST_F(MoEExpertsPluginBuild, TakesTheFp8FormOfItsFp8Images) {
  std::vector<nvinfer1::DynamicPluginTensorDesc> io;
  auto p = quantized_plugin(Node{}, kFp8Node, &io);
  ASSERT_NE(p, nullptr);
  io[3].desc.type = DataType::kINT8;  // INT4 bytes are not this node's
  EXPECT_FALSE(build(*p)->supportsFormatCombination(3, io.data(), 9, 1));
  io[7].desc.type = DataType::kBF16;  // nor INT4's scales
  EXPECT_FALSE(build(*p)->supportsFormatCombination(7, io.data(), 9, 1));

  // Shapes: T = 5 tokens, k = 2, E = 4, H = 32, F = 48 (gated: N1 = 96); scales [E, N1] and [E, H].
  std::vector<nvinfer1::PluginTensorDesc> in(9);
  const nvinfer1::Dims shapes[] = {dims({5, 32}), dims({5, 2}),  dims({5, 2}),  dims({4, 96, 32}), dims({4, 32, 48}),
                                   dims({4, 96}), dims({4, 32}), dims({4, 96}), dims({4, 32})};
  for (int i = 0; i < 9; ++i) {
    in[i].type = kFp8Node[i];
    in[i].format = nvinfer1::TensorFormat::kLINEAR;
    in[i].dims = shapes[i];
  }
  nvinfer1::PluginTensorDesc output{};
  output.dims = shapes[0];
  auto* runtime =
      static_cast<nvinfer1::IPluginV3OneRuntime*>(p->getCapabilityInterface(nvinfer1::PluginCapabilityType::kRUNTIME));
  EXPECT_EQ(runtime->onShapeChange(in.data(), 9, &output, 1), 0) << messages_.text;
  in[8].dims = dims({4, 48});  // w_down's scales per its H = 32 output channels, not per F
  EXPECT_EQ(runtime->onShapeChange(in.data(), 9, &output, 1), -1);
  EXPECT_NE(messages_.text.find("inconsistent shapes (activation 0, N1 = 2F, FP8: weights [E, N, K], scales [E, N]): "
                                "hidden[5, 32]"),
            std::string::npos)
      << messages_.text;
  in[8].dims = dims({4, 32, 1});  // INT4's rank
  EXPECT_EQ(runtime->onShapeChange(in.data(), 9, &output, 1), -1);
  EXPECT_NE(messages_.text.find("w_down_scale is [4, 32, 1]"), std::string::npos) << messages_.text;
}

TEST_F(MoEExpertsPluginBuild, RefusesMalformedFp8FormsSayingWhy) {
  std::vector<DataType> int8_weights = kFp8Node, bf16_scales = kFp8Node, half = kFp8Node, no_scales = kFp8Node;
  int8_weights[4] = DataType::kINT8;
  bf16_scales[7] = DataType::kBF16;
  for (int i : {0, 5, 6}) half[i] = DataType::kHALF;
  no_scales.pop_back();
  expect_refused(Node{}, {
      {int8_weights, "w_down must be kFP8 (FP8 e4m3 weights); it is kINT8"},
      {bf16_scales, "w_gate_up_scale must be kFLOAT (FP8 scales per output channel); it is kBF16"},
      {half, "the blob has no MoE experts kernel image of FP8 weights for hidden's kHALF (it has bf16); re-export with "
             "fused_experts on, expert_precision = \"fp8\" and this precision"},
      {no_scales, "MoEExperts takes 5 inputs (hidden, topk_ids, topk_weights, w_gate_up, w_down) and up to 2 biases, "
                  "or 9 with FP8 weights (both biases, then w_gate_up_scale, w_down_scale); the node has 8"},
  });
}

}  // namespace
}  // namespace et_trt
