// build_plan: the blob's ONNX through TensorRT's parser (GroupedMM nodes take
// the blob's kernel images) and builder, with the blob's BuildOptions.
#include "tensorrt_builder.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "log.h"
#include "provider_choice.h"

namespace et_trt {
namespace {

using nvinfer1::Dims;

Dims profile_dims(const IoSpec& spec, int which) {
  Dims dims{};
  dims.nbDims = static_cast<int32_t>(spec.dims.size());
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    const DimRange& d = spec.dims[i];
    dims.d[i] = which == 0 ? d.min : which == 1 ? d.opt : d.max;
  }
  return dims;
}

// Logs the builder's phases, so a build of several minutes shows progress.
class BuildProgress final : public nvinfer1::IProgressMonitor {
 public:
  explicit BuildProgress(std::string part) : part_(std::move(part)) {}
  void phaseStart(const char* phase, const char* parent, int32_t steps) noexcept override {
    if (parent == nullptr) {
      log_info("et-trt: building '" + part_ + "': " + phase + " (" + std::to_string(steps) + " steps)");
    }
  }
  bool stepComplete(const char*, int32_t) noexcept override { return true; }
  void phaseFinish(const char* phase) noexcept override {
    log_info("et-trt: building '" + part_ + "': " + phase + " done");
  }

 private:
  std::string part_;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// TensorRT 10.13 and later parse an ONNX whose initializers the caller hands
// over from memory (IParser::loadInitializer).
#define ET_TRT_PARSER_LOADS_INITIALIZERS (NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 13))

// Parses the blob's ONNX, its external initializers (the weights, schema.fbs
// table Weight) taken from the fetched named data: from memory where the
// parser can, else (TensorRT 10.3 on JetPack 6) as ONNX external-data files
// written to a temporary folder for the parse, the one copy the older parser
// needs.
bool parse_onnx(nvonnxparser::IParser& parser, const blob::Blob& root, const PartitionData& data, std::string* error) {
  const auto* onnx = root.onnx();
  if (data.weights.empty()) return parser.parse(onnx->data(), onnx->size());
#if ET_TRT_PARSER_LOADS_INITIALIZERS
  (void)error;
  if (!parser.loadModelProto(onnx->data(), onnx->size())) return false;
  for (const auto& [name, bytes] : data.weights) {
    if (!parser.loadInitializer(name.c_str(), bytes.data, bytes.size)) return false;
  }
  return parser.parseModelProto();
#else
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TMPDIR");
  std::string folder = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/et_trt_onnx_XXXXXX";
  if (mkdtemp(folder.data()) == nullptr) {
    *error = "cannot create a temporary folder for the ONNX's external data: " + std::string(std::strerror(errno));
    return false;
  }
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } cleanup{folder};
  const auto* weights = root.weights();
  for (flatbuffers::uoffset_t i = 0; i < weights->size(); ++i) {
    const fs::path file = fs::path(folder) / weights->Get(i)->data()->key()->str();  // the ONNX location
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    std::ofstream out(file, std::ios::binary);
    const NamedBytes& bytes = data.weights[i].second;
    if (ec || !out.write(static_cast<const char*>(bytes.data), static_cast<std::streamsize>(bytes.size))) {
      *error = "cannot write the ONNX's external data to " + file.string() + " (disk full?)";
      return false;
    }
  }
  const std::string model = folder + "/model.onnx";
  return parser.parse(onnx->data(), onnx->size(), model.c_str());
#endif
}

}  // namespace

bool build_plan(TensorRTLibrary& trt, const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                const std::string& timing_cache_path, std::vector<uint8_t>* plan, std::string* error) {
  const blob::Blob& root = *blob.root;
  const std::string part = root.part() ? root.part()->str() : "";
  auto builder = trt.create_builder();
  if (builder == nullptr) {
    *error = "TensorRT could not create a builder";
    return false;
  }
  // Strongly typed on every TensorRT: the lowering wrote the recipe's precision
  // into the ONNX's tensor types (lowering/precision.py), float32 islands
  // included, and TensorRT 11 networks are strongly typed only. TensorRT 10
  // must be asked: weakly typed (its default), with the kFP16/kBF16 flags set
  // before, the builder could run layers in other types than the ONNX's. No
  // precision flag is set; kTF32 still governs the float32 layers.
#if NV_TENSORRT_MAJOR < 11
  const nvinfer1::NetworkDefinitionCreationFlags flags =
      1U << static_cast<uint32_t>(nvinfer1::NetworkDefinitionCreationFlag::kSTRONGLY_TYPED);
#else
  const nvinfer1::NetworkDefinitionCreationFlags flags = 0;
#endif
  std::unique_ptr<nvinfer1::INetworkDefinition> network(builder->createNetworkV2(flags));
  if (network == nullptr) {
    *error = "TensorRT could not create a network";
    return false;
  }
  auto parser = trt.create_parser(*network);
  if (parser == nullptr) {
    *error = "TensorRT could not create its ONNX parser";
    return false;
  }
  {
    KernelImagesForParsing images(register_kernel_images(root, data.kernel_images));
    std::string parse_error;
    if (!parse_onnx(*parser, root, data, &parse_error)) {
      *error = parse_error.empty() ? "TensorRT's ONNX parser refused the partition:" : parse_error;
      for (int i = 0; i < parser->getNbErrors(); ++i) *error += std::string(" [") + parser->getError(i)->desc() + "]";
      return false;
    }
  }

  std::unique_ptr<nvinfer1::IBuilderConfig> config(builder->createBuilderConfig());
  const blob::BuildOptions& options = *root.build_options();
  if (options.workspace_bytes() > 0) {
    config->setMemoryPoolLimit(nvinfer1::MemoryPoolType::kWORKSPACE, options.workspace_bytes());
  }
  config->setBuilderOptimizationLevel(options.optimization_level());
  if (options.tf32()) {
    config->setFlag(nvinfer1::BuilderFlag::kTF32);
  } else {
    config->clearFlag(nvinfer1::BuilderFlag::kTF32);
  }
  nvinfer1::IOptimizationProfile* profile = builder->createOptimizationProfile();
  for (int32_t i = 0; i < network->getNbInputs(); ++i) {
    const char* name = network->getInput(i)->getName();
    const IoSpec* spec = nullptr;
    for (const IoSpec& s : io.inputs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      *error = std::string("the ONNX input '") + name + "' is not among the blob's inputs";
      return false;
    }
    for (int which = 0; which < 3; ++which) {
      const auto selector = static_cast<nvinfer1::OptProfileSelector>(which);
      if (!profile->setDimensions(name, selector, profile_dims(*spec, which))) {
        *error = "TensorRT refused the optimization profile of input '" + spec->name + "' " + spec_string(*spec);
        return false;
      }
    }
  }
  config->addOptimizationProfile(profile);
  std::unique_ptr<nvinfer1::ITimingCache> timing_cache;
  if (!timing_cache_path.empty()) {
    const std::vector<uint8_t> bytes = read_file(timing_cache_path);
    timing_cache.reset(config->createTimingCache(bytes.data(), bytes.size()));
    if (timing_cache) config->setTimingCache(*timing_cache, false);
  }
  BuildProgress progress(part);
  config->setProgressMonitor(&progress);

  log_info(std::string("et-trt: building the ") + provider_name(trt.provider()) + " " + trt.version() +
           " engine of '" + part + "' from its ONNX (" + std::to_string(root.onnx()->size()) +
           " bytes); this can take minutes");
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<nvinfer1::IHostMemory> serialized(builder->buildSerializedNetwork(*network, *config));
  if (serialized == nullptr) {
    *error = "TensorRT could not build the engine of '" + part + "' (TensorRT's errors are above)";
    return false;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char took[32];
  std::snprintf(took, sizeof(took), "%.1f", seconds);
  log_info("et-trt: built '" + part + "' in " + took + " s (" + std::to_string(serialized->size()) + " bytes)");
  if (!timing_cache_path.empty() && config->getTimingCache() != nullptr) {
    std::unique_ptr<nvinfer1::IHostMemory> cache(config->getTimingCache()->serialize());
    if (cache) {
      std::ofstream(timing_cache_path, std::ios::binary)
          .write(static_cast<const char*>(cache->data()), static_cast<std::streamsize>(cache->size()));
    }
  }
  const auto* bytes = static_cast<const uint8_t*>(serialized->data());
  plan->assign(bytes, bytes + serialized->size());
  return true;
}

}  // namespace et_trt
