// create_engine for a build without TensorRT's headers: the delegate still
// loads, registers and verifies blobs, and init says what is missing.
#include "engine.h"

namespace et_trt {

namespace {

void not_built(EngineError* error) {
  error->kind = EngineError::Kind::kUnavailable;
  error->message =
      "TensorRT support was not built into libet_trt_runtime.so: configure runtime/ with "
      "-DET_TRT_TENSORRT_INCLUDE_DIR=<dir with NvInfer.h and NvOnnxParser.h> (see runtime/README.md)";
}

}  // namespace

std::unique_ptr<Engine> create_engine(const BlobView&, const PartitionIo&, const PartitionData&, const EngineOptions&,
                                      EngineError* error) {
  not_built(error);
  return nullptr;
}

bool build_engine_plan(const BlobView&, const PartitionIo&, const PartitionData&, int, const std::string&,
                       std::vector<uint8_t>*, EngineTarget*, EngineError* error) {
  not_built(error);
  return false;
}

}  // namespace et_trt
