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

#include "build_options_generated.h"
#include "grouped_mm_plugin.h"
#include "kernel_images.h"
#include "provider_choice.h"
#include "rtx_build_target.h"

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
  BuildProgress(TensorRTLogger& logger, std::string part) : logger_(logger), part_(std::move(part)) {}
  void phaseStart(const char* phase, const char* parent, int32_t steps) noexcept override {
    if (parent == nullptr) {
      logger_.note("et-trt: building '" + part_ + "': " + phase + " (" + std::to_string(steps) + " steps)");
    }
  }
  bool stepComplete(const char*, int32_t) noexcept override { return true; }
  void phaseFinish(const char* phase) noexcept override {
    logger_.note("et-trt: building '" + part_ + "': " + phase + " done");
  }

 private:
  TensorRTLogger& logger_;
  std::string part_;
};

// One parser error as the parser states it, with the node it concerns.
std::string parser_error(const nvonnxparser::IParserError& error) {
  const char* node = error.nodeName();
  const std::string where = node != nullptr && node[0] != '\0'
                                ? std::string("node '") + node + "' (" + error.nodeOperator() + ")"
                                : std::string("model");
  return where + ": " + error.desc();
}

// How the GroupedMM plugin begins its messages (grouped_mm_plugin.cc): its refusals while parsing explain the
// parser's "could not create the plugin".
bool from_plugin(const std::string& message) { return message.rfind("GroupedMM plugin: ", 0) == 0; }

// The dtype name of a TensorRT type, as the IO specs name theirs.
std::string type_name(nvinfer1::DataType type) {
  for (blob::DType dtype : blob::EnumValuesDType()) {
    nvinfer1::DataType bound;
    if (to_trt_dtype(dtype, &bound) && bound == type) return dtype_name(dtype);
  }
  return "a type no IO spec has";
}

// Where a network input or output has another type than its IO spec: the runtime binds each ExecuTorch tensor
// as its spec says and refuses an engine whose tensor differs (tensorrt_executor.cc), e.g. an int64 input the
// parser did not keep as INT64.
std::vector<std::string> io_type_mismatches(const nvinfer1::INetworkDefinition& network, const PartitionIo& io) {
  std::vector<std::string> mismatches;
  const auto check = [&](const nvinfer1::ITensor& tensor, const std::vector<IoSpec>& specs) {
    for (const IoSpec& spec : specs) {
      nvinfer1::DataType bound;
      if (spec.name != tensor.getName()) continue;
      if (!to_trt_dtype(spec.dtype, &bound) || bound != tensor.getType()) {
        mismatches.push_back("'" + spec.name + "': the network's is " + type_name(tensor.getType()) +
                             ", the IO spec's " + dtype_name(spec.dtype));
      }
    }
  };
  for (int32_t i = 0; i < network.getNbInputs(); ++i) check(*network.getInput(i), io.inputs);
  std::vector<IoSpec> checks;
  for (const CheckSpec& c : io.checks) checks.push_back({c.output, blob::DType::Bool, {}});
  for (int32_t i = 0; i < network.getNbOutputs(); ++i) {
    check(*network.getOutput(i), io.outputs);
    check(*network.getOutput(i), checks);
  }
  return mismatches;
}

// The config of the blob's build options for `request`, with one profile from the IO specs' ranges. Each option
// is declared in et_trt_backend/options.py (build_option) with its type, range and default, which the blob reader
// has checked; build_option:: names them.
bool configure(nvinfer1::IBuilder& builder, const nvinfer1::INetworkDefinition& network,
               const BuildOptions& options, const PartitionIo& io, const BuildRequest& request,
               nvinfer1::IBuilderConfig& config, std::string* error) {
  if (const auto bytes = options.get(build_option::workspace_bytes)) {
    config.setMemoryPoolLimit(nvinfer1::MemoryPoolType::kWORKSPACE, static_cast<size_t>(*bytes));
  }
  config.setBuilderOptimizationLevel(static_cast<int32_t>(*options.get(build_option::optimization_level)));
  if (*options.get(build_option::tf32)) {
    config.setFlag(nvinfer1::BuilderFlag::kTF32);
  } else {
    config.clearFlag(nvinfer1::BuilderFlag::kTF32);
  }
  nvinfer1::IOptimizationProfile* profile = builder.createOptimizationProfile();
  for (int32_t i = 0; i < network.getNbInputs(); ++i) {
    const char* name = network.getInput(i)->getName();
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
  config.addOptimizationProfile(profile);
  if (request.ahead_of_time_target == 0) return true;
#if NV_TENSORRT_MAJOR >= 11
  return rtx::set_build_target(config, request.ahead_of_time_target, error);
#else
  *error = "builds ahead of time need TensorRT for RTX, which needs et-trt built against TensorRT 11 headers";
  return false;
#endif
}

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
                const BuildRequest& request, std::vector<uint8_t>* plan, std::vector<std::string>* not_applied,
                BuildFailure* failure) {
  const blob::Blob& root = *blob.root;
  const std::string part = root.part() ? root.part()->str() : "";
  const std::string provider = std::string(provider_name(trt.provider())) + " " + trt.version();
  const std::string target =
      request.ahead_of_time_target != 0 ? "sm_" + std::to_string(request.ahead_of_time_target) : "this GPU";
  const auto fail = [&](std::string summary) {
    failure->summary = std::move(summary);
    return false;
  };
  std::string message;
  if (!trt.use_plugins(&message)) return fail(message);
  std::vector<std::string>& logged = failure->errors;
  TensorRTLogger::Capture capture(&logged);
  auto builder = trt.create_builder();
  if (builder == nullptr) return fail(provider + " could not create a builder");
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
  if (network == nullptr) return fail(provider + " could not create a network");
  auto parser = trt.create_parser(*network);
  if (parser == nullptr) return fail(provider + " could not create its ONNX parser");
  {
    KernelImagesForParsing images(register_kernel_images(root, data.kernel_images));
    if (!parse_onnx(*parser, root, data, &message)) {
      std::vector<std::string> errors;
      if (!message.empty()) errors.push_back(message);
      for (int i = 0; i < parser->getNbErrors(); ++i) errors.push_back(parser_error(*parser->getError(i)));
      for (const std::string& m : logged) {
        if (from_plugin(m)) errors.push_back(m);
      }
      logged.swap(errors);
      failure->parsed = false;
      return fail(std::string(provider_name(trt.provider())) + "'s ONNX parser refused the partition");
    }
  }
  std::vector<std::string> mismatches = io_type_mismatches(*network, io);
  if (!mismatches.empty()) {
    logged.swap(mismatches);
    return fail("the parsed network's IO types are not the blob's IO specs, by which the runtime binds "
                "ExecuTorch's tensors (it would refuse the engine)");
  }
  std::unique_ptr<nvinfer1::IBuilderConfig> config(builder->createBuilderConfig());
  if (config == nullptr) return fail(provider + " could not create a builder config");
  if (!configure(*builder, *network, blob.build_options, io, request, *config, &message)) return fail(message);
  std::unique_ptr<nvinfer1::ITimingCache> timing_cache;
  const bool reads_timing_cache = !request.timing_cache_path.empty() && request.ahead_of_time_target == 0;
  if (reads_timing_cache) {
    const std::vector<uint8_t> bytes = read_file(request.timing_cache_path);
    timing_cache.reset(config->createTimingCache(bytes.data(), bytes.size()));
    if (timing_cache) config->setTimingCache(*timing_cache, false);
  } else if (!request.timing_cache_path.empty()) {
    not_applied->push_back("timing_cache '" + request.timing_cache_path + "': not read by a build ahead of time (" +
                           provider_name(trt.provider()) + " reads one only with a GPU present)");
  }
  BuildProgress progress(trt.logger(), part);
  config->setProgressMonitor(&progress);

  trt.logger().note("et-trt: building the " + provider + " engine of '" + part + "' for " + target +
                    " from its ONNX (" + std::to_string(root.onnx()->size()) + " bytes); this can take minutes");
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<nvinfer1::IHostMemory> serialized(builder->buildSerializedNetwork(*network, *config));
  if (serialized == nullptr) return fail(provider + " could not build the engine of '" + part + "' for " + target);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char took[64];
  std::snprintf(took, sizeof(took), "%.1f s (%zu bytes)", seconds, serialized->size());
  trt.logger().note("et-trt: built '" + part + "' for " + target + " in " + took);
  if (reads_timing_cache && config->getTimingCache() != nullptr) {
    std::unique_ptr<nvinfer1::IHostMemory> cache(config->getTimingCache()->serialize());
    if (cache) {
      std::ofstream(request.timing_cache_path, std::ios::binary)
          .write(static_cast<const char*>(cache->data()), static_cast<std::streamsize>(cache->size()));
    }
  }
  const auto* bytes = static_cast<const uint8_t*>(serialized->data());
  plan->assign(bytes, bytes + serialized->size());
  logged.clear();
  return true;
}

std::string describe(const BuildFailure& failure) {
  std::string text = failure.summary;
  for (size_t i = 0; i < failure.errors.size(); ++i) text += (i == 0 ? ": " : "; ") + failure.errors[i];
  return text;
}

}  // namespace et_trt
