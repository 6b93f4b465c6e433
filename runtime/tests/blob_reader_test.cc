// The blob reader against blobs from the Python writer, the example export,
// and blobs built here with the flatbuffers API to reach each check.
#include <gtest/gtest.h>

#include <functional>
#include <iterator>
#include <set>
#include <sstream>

#include "blob_reader.h"
#include "build_options_generated.h"
#include "io_spec.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

using testing::Bytes;

BlobError read_error(const std::vector<uint8_t>& blob) {
  Bytes bytes = Bytes::of(blob);
  BlobView view;
  BlobError error;
  EXPECT_FALSE(read_blob(bytes.data(), bytes.size, &view, &error)) << "accepted a bad blob";
  return error;
}

std::vector<uint8_t> writer_blob(const std::string& name) {
  const std::string dir = testing::blob_dir();
  EXPECT_FALSE(dir.empty()) << "ET_TRT_TEST_BLOBS is not set (ctest sets it)";
  std::vector<uint8_t> blob = testing::read_file(dir + "/" + name + ".blob");
  EXPECT_FALSE(blob.empty()) << "missing " << dir << "/" << name << ".blob";
  return blob;
}

// ---- blobs written by Python ----

// Option `index` of the generated table as make_test_blobs.py writes it: "none", "true", "false", the number or
// the choice.
std::string option_text(const BuildOptions& options, size_t index) {
  switch (build_option::kSpecs[index].type) {
    case OptionType::kBool: {
      const std::optional<bool> value = options.get(BoolOption{index});
      return value ? (*value ? "true" : "false") : "none";
    }
    case OptionType::kInt: {
      const std::optional<int64_t> value = options.get(IntOption{index});
      return value ? std::to_string(*value) : "none";
    }
    case OptionType::kChoice: {
      const std::optional<std::string_view> value = options.get(ChoiceOption{index});
      return value ? std::string(*value) : "none";
    }
  }
  return "?";
}

void expect_matches_sidecar(const BlobView& view, const std::string& sidecar) {
  std::istringstream lines(sidecar);
  std::string line;
  size_t inputs = 0, outputs = 0, checks = 0;
  std::set<std::string> options;  // the build options the sidecar names: options.py's
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "part") {
      std::string part;
      words >> part;
      EXPECT_EQ(view.root->part()->str(), part);
    } else if (key == "input" || key == "output") {
      const auto* specs = key == "input" ? view.root->inputs() : view.root->outputs();
      size_t& index = key == "input" ? inputs : outputs;
      ASSERT_LT(index, specs->size());
      const blob::TensorSpec* spec = specs->Get(index++);
      std::string name;
      int dtype;
      words >> name >> dtype;
      EXPECT_EQ(spec->name()->str(), name);
      EXPECT_EQ(int(spec->dtype()), dtype);
      std::string dim;
      size_t d = 0;
      while (words >> dim) {
        ASSERT_LT(d, spec->dims()->size());
        const blob::Dim* got = spec->dims()->Get(d++);
        std::ostringstream text;
        text << got->size() << ":" << got->name()->str() << ":" << got->min() << ":" << got->opt() << ":"
             << got->max();
        EXPECT_EQ(text.str(), dim) << name << " dim " << d - 1;
      }
      EXPECT_EQ(d, spec->dims()->size());
    } else if (key == "check") {
      ASSERT_NE(view.root->checks(), nullptr);
      ASSERT_LT(checks, view.root->checks()->size());
      const blob::Check* check = view.root->checks()->Get(checks++);
      std::string name, message;
      words >> name;
      std::getline(words >> std::ws, message);
      EXPECT_EQ(check->output()->name()->str(), name);
      EXPECT_EQ(check->message()->str(), message);
    } else if (key == "onnx_size") {
      size_t size;
      words >> size;
      EXPECT_EQ(view.root->onnx()->size(), size);
    } else if (key == "option") {
      std::string name, value;
      words >> name >> value;
      options.insert(name);
      size_t index = 0;
      while (index < std::size(build_option::kSpecs) && name != build_option::kSpecs[index].name) ++index;
      ASSERT_LT(index, std::size(build_option::kSpecs)) << "the runtime's table lacks build option " << name;
      EXPECT_EQ(option_text(view.build_options, index), value) << name;
    }
  }
  EXPECT_EQ(options.size(), std::size(build_option::kSpecs)) << "the runtime's table has build options options.py "
                                                                "lacks";
  EXPECT_EQ(inputs, view.root->inputs()->size());
  EXPECT_EQ(outputs, view.root->outputs()->size());
  EXPECT_EQ(checks, view.root->checks() == nullptr ? 0 : view.root->checks()->size());
}

TEST(BlobReader, ReadsWhatThePythonWriterWrote) {
  for (const char* name : {"writer_static", "writer_dynamic"}) {
    SCOPED_TRACE(name);
    Bytes bytes = Bytes::of(writer_blob(name));
    BlobView view;
    BlobError error;
    ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
    const std::vector<uint8_t> sidecar = testing::read_file(testing::blob_dir() + "/" + name + ".expected");
    ASSERT_FALSE(sidecar.empty());
    expect_matches_sidecar(view, std::string(sidecar.begin(), sidecar.end()));
    EXPECT_EQ(view.content_id_hex().size(), 64u);
    EXPECT_EQ(view.header.payload_size, bytes.size - kHeaderSize);
  }
}

TEST(BlobReader, AcceptsTheExampleExportsBlobs) {
  size_t examples = 0;
  for (const std::string& path : testing::blob_files(testing::blob_dir())) {
    if (path.find("/example_") == std::string::npos) continue;
    SCOPED_TRACE(path);
    Bytes bytes = Bytes::of(testing::read_file(path));
    BlobView view;
    BlobError error;
    ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
    EXPECT_GT(view.root->onnx()->size(), 0u);
    EXPECT_GT(view.root->inputs()->size(), 0u);
    ++examples;
  }
  if (examples == 0) GTEST_SKIP() << "no example .pte was exported (scripts/setup.sh writes out/moe_policy.pte)";
}

TEST(BlobReader, TakesExactlyThePythonSchemasBuildOptionValues) {
  // make_test_blobs.py names each blob by whether et_trt_backend/options.py takes its option's value.
  const std::vector<std::string> paths = testing::blob_files(testing::blob_dir() + "/ranges");
  ASSERT_GE(paths.size(), 3u) << "make_test_blobs.py wrote no ranges/ blobs";
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    Bytes bytes = Bytes::of(testing::read_file(path));
    BlobView view;
    BlobError error;
    const bool accepted = read_blob(bytes.data(), bytes.size, &view, &error);
    EXPECT_EQ(accepted, path.find("_accepted.blob") != std::string::npos) << error.message;
    if (!accepted) {
      EXPECT_NE(error.message.find("' must be "), std::string::npos) << error.message;
    }
  }
}

// ---- the header ----

TEST(BlobReader, RefusesWrongMagic) {
  std::vector<uint8_t> blob = writer_blob("writer_static");
  blob[0] = 'X';
  const BlobError e = read_error(blob);
  EXPECT_EQ(e.kind, BlobError::Kind::kInvalid);
  EXPECT_NE(e.message.find("magic"), std::string::npos) << e.message;
}

TEST(BlobReader, RefusesOtherSchemaVersionAsIncompatible) {
  for (uint32_t other : {kSchemaVersion - 1, kSchemaVersion + 1}) {  // an older export (weights inside), a newer one
    std::vector<uint8_t> blob = writer_blob("writer_static");
    testing::store_u32(blob.data() + 8, other);
    const BlobError e = read_error(blob);
    EXPECT_EQ(e.kind, BlobError::Kind::kIncompatible);
    EXPECT_NE(e.message.find("blob schema version " + std::to_string(other) + ", this runtime reads version " +
                             std::to_string(kSchemaVersion) + ": re-export the model"),
              std::string::npos)
        << e.message;
  }
}

TEST(BlobReader, RefusesTruncatedAndExtendedBlobs) {
  const std::vector<uint8_t> blob = writer_blob("writer_static");
  std::vector<uint8_t> shorter(blob.begin(), blob.end() - 1);
  EXPECT_NE(read_error(shorter).message.find("truncated or extended"), std::string::npos);
  std::vector<uint8_t> longer = blob;
  longer.push_back(0);
  EXPECT_NE(read_error(longer).message.find("truncated or extended"), std::string::npos);
  std::vector<uint8_t> header_only(blob.begin(), blob.begin() + 20);
  EXPECT_NE(read_error(header_only).message.find("shorter than its 56-byte header"), std::string::npos);
  BlobView view;
  BlobError error;
  EXPECT_FALSE(read_blob(nullptr, 0, &view, &error));
}

TEST(BlobReader, RefusesChecksumMismatch) {
  std::vector<uint8_t> blob = writer_blob("writer_static");
  blob[blob.size() / 2] ^= 0x10;
  const BlobError e = read_error(blob);
  EXPECT_NE(e.message.find("checksum mismatch"), std::string::npos) << e.message;
}

TEST(BlobReader, RefusesContentIdMismatch) {
  std::vector<uint8_t> blob = writer_blob("writer_static");
  blob[blob.size() - 3] ^= 0x01;  // payload changed, checksum fixed, content id stale
  const uint32_t crc = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), blob.data() + 16, uInt(blob.size() - 16)));
  testing::store_u32(blob.data() + 12, crc);
  EXPECT_NE(read_error(blob).message.find("content id (sha256)"), std::string::npos);
}

TEST(BlobReader, RefusesMisalignedPayload) {
  const std::vector<uint8_t> blob = writer_blob("writer_static");
  std::vector<uint64_t> storage(blob.size() / 8 + 2);
  uint8_t* shifted = reinterpret_cast<uint8_t*>(storage.data()) + 1;
  std::memcpy(shifted, blob.data(), blob.size());
  BlobView view;
  BlobError error;
  EXPECT_FALSE(read_blob(shifted, blob.size(), &view, &error));
  EXPECT_NE(error.message.find("aligned"), std::string::npos) << error.message;
}

TEST(BlobReader, RefusesPayloadThatIsNotOurFlatbuffer) {
  const std::vector<uint8_t> noise = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  EXPECT_NE(read_error(testing::seal(noise.data(), noise.size())).message.find("flatbuffers verification"),
            std::string::npos);
  // A well-formed flatbuffer of our schema, but with another file identifier.
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(blob::CreateBlobDirect(fbb, "part"), "XXXX");
  EXPECT_NE(read_error(testing::seal(fbb.GetBufferPointer(), fbb.GetSize())).message.find("verification"),
            std::string::npos);
}

// ---- checks beyond the verifier, on blobs built with the flatbuffers API ----

// One build_options entry: its name and a value of `type` (a bool's or an int's `number`, or `choice`).
struct OptionEntry {
  const char* name;
  blob::OptionValue type;
  int64_t number = 0;
  const char* choice = nullptr;
};

std::vector<flatbuffers::Offset<blob::BuildOption>> option_entries(flatbuffers::FlatBufferBuilder& fbb,
                                                                   const std::vector<OptionEntry>& entries) {
  std::vector<flatbuffers::Offset<blob::BuildOption>> offsets;
  for (const OptionEntry& e : entries) {
    flatbuffers::Offset<void> value =
        e.type == blob::OptionValue::BoolValue  ? blob::CreateBoolValue(fbb, e.number != 0).Union()
        : e.type == blob::OptionValue::IntValue ? blob::CreateIntValue(fbb, e.number).Union()
                                                : blob::CreateChoiceValueDirect(fbb, e.choice).Union();
    offsets.push_back(blob::CreateBuildOptionDirect(fbb, e.name, e.type, value));
  }
  return offsets;
}

struct Knobs {
  int64_t size = -1, min = 1, opt = 8, max = 64;
  blob::DType dtype = blob::DType::BFloat16;
  const char* output_name = "y";
  const char* part = "velocity";
  bool outputs = true, onnx = true, engine = false, producer = true;
  blob::Provider provider = blob::Provider::TensorRT;
  std::vector<OptionEntry> options = {{"tf32", blob::OptionValue::BoolValue, 1},
                                      {"optimization_level", blob::OptionValue::IntValue, 3}};
  // Named data of the engine plan and of the one weight (when weight_name is set).
  const char* plan_key = "et_trt/0a";
  size_t plan_sha256_size = 32;
  const char* weight_name = nullptr;
  const char* weight_key = "et_trt/0b";
  bool two_weights_of_one_name = false;
  int rank = 2;
  bool kernel = true;
  blob::DType kernel_dtype = blob::DType::BFloat16;
  const char* kernel_name = "grouped_mm_tma_nk";
  const char* kernel_entry = "grouped_mm_tma_nk";
  const char* kernel_variant = "tma";
  int32_t block_m = 128;
  int32_t scratch_align = 128;
  // One check (table Check) where check_name is set.
  const char* check_name = nullptr;
  blob::DType check_dtype = blob::DType::Bool;
  bool check_ranked = false;
  const char* check_message = "the mask selects another number of rows";
};

std::vector<uint8_t> build(const Knobs& k) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::Dim>> dims;
  for (int d = 0; d < k.rank; ++d) {
    dims.push_back(d == 0 ? blob::CreateDimDirect(fbb, k.size, "tokens", k.min, k.opt, k.max)
                          : blob::CreateDimDirect(fbb, 16, "x:1", 16, 16, 16));
  }
  std::vector<flatbuffers::Offset<blob::TensorSpec>> inputs = {
      blob::CreateTensorSpecDirect(fbb, "x", k.dtype, &dims)};
  std::vector<flatbuffers::Offset<blob::TensorSpec>> outputs;
  if (k.outputs) outputs.push_back(blob::CreateTensorSpecDirect(fbb, k.output_name, blob::DType::BFloat16, &dims));
  const std::vector<uint8_t> onnx = {8, 9};
  const std::vector<uint8_t> image_sha256(32, 3);
  std::vector<flatbuffers::Offset<blob::KernelImage>> kernels;
  if (k.kernel) {
    auto image = blob::CreateNamedDataDirect(fbb, "et_trt/0c", 3, &image_sha256);
    kernels.push_back(blob::CreateKernelImageDirect(fbb, k.kernel_name, k.kernel_variant, true, "sm_90a",
                                                    blob::ImageFormat::Cubin, image, k.kernel_entry, k.kernel_dtype,
                                                    8, 1024, 384, k.scratch_align, 0, k.block_m, 256, 64, false,
                                                    "8.6"));
  }
  const std::vector<uint8_t> plan_sha256(k.plan_sha256_size, 7), weight_sha256(32, 8);
  std::vector<flatbuffers::Offset<blob::Engine>> engines;
  if (k.engine) {
    auto plan = blob::CreateNamedDataDirect(fbb, k.plan_key, 4096, &plan_sha256);
    engines.push_back(blob::CreateEngineDirect(fbb, plan, k.provider, "10.13.0", "H200", 90));
  }
  std::vector<flatbuffers::Offset<blob::Weight>> weights;
  for (int i = 0; k.weight_name != nullptr && i < (k.two_weights_of_one_name ? 2 : 1); ++i) {
    weights.push_back(blob::CreateWeightDirect(fbb, k.weight_name,
                                               blob::CreateNamedDataDirect(fbb, k.weight_key, 2048, &weight_sha256)));
  }
  const std::vector<flatbuffers::Offset<blob::BuildOption>> options = option_entries(fbb, k.options);
  auto producer = k.producer ? blob::CreateProducerDirect(fbb, "0.1.0", "2.13.0", "1.5.1", 18) : 0;
  std::vector<flatbuffers::Offset<blob::Check>> checks;
  if (k.check_name != nullptr) {
    std::vector<flatbuffers::Offset<blob::Dim>> check_dims;
    if (k.check_ranked) check_dims.push_back(blob::CreateDimDirect(fbb, 1, "", 1, 1, 1));
    checks.push_back(blob::CreateCheckDirect(fbb, blob::CreateTensorSpecDirect(fbb, k.check_name, k.check_dtype,
                                                                                 &check_dims),
                                             k.check_message));
  }
  fbb.Finish(blob::CreateBlobDirect(fbb, k.part, producer, &inputs, &outputs, &options, "{}",
                                    k.onnx ? &onnx : nullptr, &weights, &kernels, &engines, "policy.ptd", &checks),
             blob::BlobIdentifier());
  return testing::seal(fbb.GetBufferPointer(), fbb.GetSize());
}

std::string refusal(const Knobs& k) { return read_error(build(k)).message; }

TEST(BlobReader, AcceptsAWellFormedBuiltBlob) {
  Bytes bytes = Bytes::of(build(Knobs{}));
  BlobView view;
  BlobError error;
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  EXPECT_EQ(view.root->kernels()->size(), 1u);
  Knobs static_dim;
  static_dim.size = 4, static_dim.min = 4, static_dim.opt = 4, static_dim.max = 4;
  bytes = Bytes::of(build(static_dim));
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  Knobs engine_only;
  engine_only.onnx = false, engine_only.engine = true;
  bytes = Bytes::of(build(engine_only));
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  Knobs with_weight;
  with_weight.weight_name = "w";
  bytes = Bytes::of(build(with_weight));
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  EXPECT_EQ(view.root->weights()->Get(0)->data()->size(), 2048u);
  EXPECT_EQ(view.root->data_file()->str(), "policy.ptd");
}

TEST(BlobReader, RefusesInconsistentDims) {
  Knobs k;
  k.size = 4, k.min = 4, k.opt = 4, k.max = 8;
  EXPECT_NE(refusal(k).find("static dim needs min = opt = max = size"), std::string::npos);
  k = Knobs{};
  k.min = 9, k.opt = 8;
  EXPECT_NE(refusal(k).find("dynamic dim needs 0 <= min <= opt <= max"), std::string::npos);
  k = Knobs{};
  k.size = -5;
  EXPECT_NE(refusal(k).find("size must be >= 0, or -1"), std::string::npos);
  k = Knobs{};
  k.rank = 9;
  EXPECT_NE(refusal(k).find("exceeds TensorRT's maximum of 8"), std::string::npos);
}

TEST(BlobReader, RefusesBadTensorSpecs) {
  Knobs k;
  k.dtype = static_cast<blob::DType>(9);
  EXPECT_NE(refusal(k).find("unknown dtype 9"), std::string::npos);
  // The exporter casts float64 outside the engine (truncate_double): no blob may ask TensorRT to bind it.
  k = Knobs{};
  k.dtype = blob::DType::Float64;
  EXPECT_NE(refusal(k).find("'x': fp64, which no TensorRT tensor holds"), std::string::npos);
  k = Knobs{};
  k.output_name = "x";
  EXPECT_NE(refusal(k).find("tensor name used twice"), std::string::npos);
  k = Knobs{};
  k.output_name = "";
  EXPECT_NE(refusal(k).find("has no name"), std::string::npos);
  k = Knobs{};
  k.outputs = false;
  EXPECT_NE(refusal(k).find("no outputs"), std::string::npos);
}

TEST(BlobReader, ReadsChecksAndRefusesMalformedOnes) {
  Knobs k;
  k.check_name = "ok";
  Bytes bytes = Bytes::of(build(k));
  BlobView view;
  BlobError error;
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  const PartitionIo io = partition_io(*view.root);
  ASSERT_EQ(io.checks.size(), 1u);
  EXPECT_EQ(io.checks[0].output, "ok");
  EXPECT_EQ(io.checks[0].message, "the mask selects another number of rows");
  bytes = Bytes::of(build(Knobs{}));
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  EXPECT_TRUE(partition_io(*view.root).checks.empty());
  k.check_dtype = blob::DType::Int64;
  EXPECT_NE(refusal(k).find("checks[0] 'ok': a check's output must be a bool scalar"), std::string::npos);
  k = Knobs{};
  k.check_name = "ok", k.check_ranked = true;
  EXPECT_NE(refusal(k).find("a check's output must be a bool scalar"), std::string::npos);
  k = Knobs{};
  k.check_name = "x";  // the input's name
  EXPECT_NE(refusal(k).find("checks[0] 'x': tensor name used twice"), std::string::npos);
  k = Knobs{};
  k.check_name = "";
  EXPECT_NE(refusal(k).find("checks[0] names no output"), std::string::npos);
  k = Knobs{};
  k.check_name = "ok", k.check_message = "";
  EXPECT_NE(refusal(k).find("checks[0] 'ok' has no message"), std::string::npos);
  k = Knobs{};
  k.check_name = "ok", k.check_message = "rows \xc3";
  EXPECT_NE(refusal(k).find("blob field checks[0].message is not UTF-8 text"), std::string::npos);
}

TEST(BlobReader, RefusesTextThatIsNotUtf8WithoutEchoingIt) {
  const auto ascii_only = [](const std::string& s) {
    for (char c : s) {
      if (static_cast<unsigned char>(c) >= 0x80) return false;
    }
    return true;
  };
  Knobs k;
  k.part = "\xff\xfevelocity";
  std::string message = refusal(k);
  EXPECT_NE(message.find("blob field part is not UTF-8 text"), std::string::npos) << message;
  EXPECT_TRUE(ascii_only(message));
  k = Knobs{};
  k.output_name = "y\xc3";  // a two-byte sequence cut off
  message = refusal(k);
  EXPECT_NE(message.find("blob field outputs[0].name is not UTF-8 text"), std::string::npos) << message;
  EXPECT_TRUE(ascii_only(message));
  k = Knobs{};
  k.part = "\xc0\xaf";  // an overlong encoding of '/'
  EXPECT_NE(refusal(k).find("part is not UTF-8"), std::string::npos);
  k = Knobs{};
  k.part = "d\xc3\xa9" "codeur.\xe5\xb1\x82";  // valid UTF-8 is accepted
  Bytes bytes = Bytes::of(build(k));
  BlobView view;
  BlobError error;
  EXPECT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
}

TEST(BlobReader, RefusesMissingOrInvalidRecords) {
  Knobs k;
  k.producer = false;
  EXPECT_NE(refusal(k).find("producer"), std::string::npos);
  k = Knobs{};
  k.onnx = false;
  EXPECT_NE(refusal(k).find("neither an ONNX model nor an engine"), std::string::npos);
  k = Knobs{};
  k.engine = true, k.provider = static_cast<blob::Provider>(5);
  EXPECT_NE(refusal(k).find("engines[0]: unknown provider 5"), std::string::npos);
}

TEST(BlobReader, ChecksBuildOptionsAgainstTheTableFromOptionsPy) {
  Knobs k;
  k.options = {{"optimization_level", blob::OptionValue::IntValue, 1},
               {"workspace_bytes", blob::OptionValue::IntValue, 1 << 20}};
  Bytes bytes = Bytes::of(build(k));
  BlobView view;
  BlobError error;
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  EXPECT_EQ(view.build_options.get(build_option::optimization_level), 1);
  EXPECT_EQ(view.build_options.get(build_option::workspace_bytes), 1 << 20);
  EXPECT_EQ(view.build_options.get(build_option::tf32), true);  // no entry: options.py's default
  k.options = {};
  bytes = Bytes::of(build(k));
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  EXPECT_EQ(view.build_options.get(build_option::optimization_level), 3);
  EXPECT_EQ(view.build_options.get(build_option::workspace_bytes), std::nullopt);  // the builder's own default

  const std::vector<std::pair<std::vector<OptionEntry>, std::string>> refused = {
      {{{"optimization_level", blob::OptionValue::IntValue, 9}},
       "blob build_options[0]: 'optimization_level' must be an integer 0-5, got 9"},
      {{{"workspace_bytes", blob::OptionValue::IntValue, 0}}, "'workspace_bytes' must be an integer 1-"},
      {{{"tactic_sources", blob::OptionValue::IntValue, 1}},
       "build_options[0]: 'tactic_sources' is not a build option of this runtime; re-export"},
      {{{"tf32", blob::OptionValue::IntValue, 1}}, "'tf32' holds a value of type IntValue; the option's type is bool"},
      {{{"tf32", blob::OptionValue::NONE}}, "'tf32' holds a value of type NONE; the option's type is bool"},
      {{{"tf32", blob::OptionValue::BoolValue, 1}, {"tf32", blob::OptionValue::BoolValue, 0}},
       "build_options[1]: 'tf32' is set twice"},
      {{{"t\xff", blob::OptionValue::BoolValue, 1}}, "build_options[0].name"},  // not UTF-8: never in a message
  };
  for (const auto& [entries, message] : refused) {
    k.options = entries;
    const std::string got = refusal(k);
    EXPECT_NE(got.find(message), std::string::npos) << got;
  }
}

// Choices are decoded by name against their table (options.py declares none yet: a table of the test's own).
TEST(BuildOptions, DecodesAChoiceByName) {
  static constexpr const char* kLevels[] = {"none", "fast", "full"};
  static constexpr OptionSpec kSpecs[] = {{"tiling", OptionType::kChoice, true, 1, 0, 2, kLevels, 3},
                                          {"fallback", OptionType::kChoice, false, 0, 0, 2, kLevels, 3}};
  const auto decode = [](const std::vector<OptionEntry>& entries, BuildOptions* options, std::string* error) {
    flatbuffers::FlatBufferBuilder fbb;
    const auto offsets = option_entries(fbb, entries);
    fbb.Finish(blob::CreateBlobDirect(fbb, nullptr, 0, nullptr, nullptr, &offsets));
    return options->decode(blob::GetBlob(fbb.GetBufferPointer())->build_options(), kSpecs, std::size(kSpecs), error);
  };
  BuildOptions options;
  std::string error;
  ASSERT_TRUE(decode({{"fallback", blob::OptionValue::ChoiceValue, 0, "full"}}, &options, &error)) << error;
  EXPECT_EQ(options.get(ChoiceOption{0}), "fast");  // its default
  EXPECT_EQ(options.get(ChoiceOption{1}), "full");
  ASSERT_TRUE(decode({}, &options, &error)) << error;
  EXPECT_EQ(options.get(ChoiceOption{1}), std::nullopt);
  EXPECT_FALSE(decode({{"tiling", blob::OptionValue::ChoiceValue, 0, "fastest"}}, &options, &error));
  EXPECT_EQ(error, "build_options[0]: 'tiling' must be one of none, fast, full, got 'fastest'");
}

TEST(BlobReader, RefusesBadNamedDataRecords) {
  Knobs k;
  k.engine = true, k.plan_key = "weights/0a";
  EXPECT_NE(refusal(k).find("engines[0].plan: key must start with \"et_trt/\""), std::string::npos) << refusal(k);
  k = Knobs{};
  k.engine = true, k.plan_sha256_size = 31;
  EXPECT_NE(refusal(k).find("engines[0].plan: sha256 must be 32 bytes"), std::string::npos);
  k = Knobs{};
  k.weight_name = "";
  EXPECT_NE(refusal(k).find("weights[0] has no name"), std::string::npos);
  k = Knobs{};
  k.weight_name = "w", k.weight_key = "";
  EXPECT_NE(refusal(k).find("weights[0].data: key must start with"), std::string::npos);
  k = Knobs{};
  k.weight_name = "w", k.two_weights_of_one_name = true;
  EXPECT_NE(refusal(k).find("weights[1]: initializer name used twice"), std::string::npos);
}

TEST(BlobReader, RefusesBadKernelImages) {
  Knobs k;
  k.kernel_dtype = blob::DType::Float32;
  EXPECT_NE(refusal(k).find("kernel dtype must be bf16 or fp16, got fp32"), std::string::npos);
  k = Knobs{};
  k.kernel_entry = "";
  EXPECT_NE(refusal(k).find("no entry symbol"), std::string::npos);
  k = Knobs{};
  k.kernel_variant = "";
  EXPECT_NE(refusal(k).find("kernels[0] names no variant"), std::string::npos);
  k = Knobs{};
  k.block_m = 0;
  EXPECT_NE(refusal(k).find("block sizes must be positive"), std::string::npos);
  k = Knobs{};
  k.scratch_align = 96;
  EXPECT_NE(refusal(k).find("power of two"), std::string::npos);
}

// The MoE experts kernels' images use a block size 0 where a size does not apply (moe_route holds no rows,
// moe_combine no K: et_trt_backend/kernels/moe_aot.py); negative sizes stay refused.
TEST(BlobReader, TakesMoEImagesWithUnusedBlockSizes) {
  Knobs k;
  k.kernel_name = k.kernel_entry = "moe_route";
  k.kernel_variant = "e64";
  k.block_m = 0;
  Bytes bytes = Bytes::of(build(k));
  BlobView view;
  BlobError error;
  EXPECT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  k.block_m = -1;
  EXPECT_NE(refusal(k).find("kernels[0]: num_warps must be positive and block sizes must not be negative"), std::string::npos);
}

}  // namespace
}  // namespace et_trt
