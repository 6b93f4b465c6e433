// create_engine for a build without TensorRT's headers: the delegate still
// loads, registers and verifies blobs, and init says what is missing.
#include <string>

#include "engine.h"

namespace et_trt {

namespace {

// How to build it in, for the way this library was built.
#ifdef ET_TRT_BUILT_AS_WHEEL
constexpr char kHowToBuildIt[] =
    "reinstall the package with TensorRT's headers: pip install . -C "
    "cmake.define.ET_TRT_TENSORRT_INCLUDE_DIR=<dir with NvInfer.h and NvOnnxParser.h>";
#else
constexpr char kHowToBuildIt[] =
    "rebuild runtime/ with TensorRT's headers: scripts/build_runtime.sh "
    "-DET_TRT_TENSORRT_INCLUDE_DIR=<dir with NvInfer.h and NvOnnxParser.h>";
#endif

void not_built(EngineError* error) {
  error->kind = EngineError::Kind::kUnavailable;
  error->message = std::string("TensorRT support was not built into libet_trt_runtime.so: ") + kHowToBuildIt +
                   " (JetPack's, NVIDIA's TensorRT packages' or github.com/NVIDIA/TensorRT's include/; "
                   "see runtime/README.md)";
}

}  // namespace

std::unique_ptr<Engine> create_engine(const BlobView&, const PartitionIo&, const PartitionData&, const EngineOptions&,
                                      EngineError* error) {
  not_built(error);
  return nullptr;
}

}  // namespace et_trt
