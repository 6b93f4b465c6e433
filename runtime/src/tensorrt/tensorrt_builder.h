// Builds a TensorRT (or TensorRT for RTX) engine from a blob's ONNX: the one
// engine builder of et-trt, used by init on the device (engine_selection.cc
// decides when to build) and by export and `et-trt check --build` through
// et_trt_build_engine (builder_capi.cc). The only code that configures
// TensorRT's builder: flags, optimization profile, target, GroupedMM plugin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "io_spec.h"
#include "named_data.h"
#include "tensorrt_library.h"

namespace et_trt {

struct BuildRequest {
  // The compute capability (major * 10 + minor) TensorRT for RTX builds for
  // ahead of time, with no GPU; 0: the GPU of the caller's current CUDA context.
  int ahead_of_time_target = 0;
  // Read and updated; empty: none.
  std::string timing_cache_path;
};

// Why a build failed: what failed, and the parser's, builder's or GroupedMM
// plugin's own messages.
struct BuildFailure {
  bool parsed = true;  // false: the parser refused the ONNX (every target fails alike)
  std::string summary;
  std::vector<std::string> errors;
};

// Builds a serialized engine from the blob's ONNX and weights (`data`, the
// blob's fetched named data) with its BuildOptions and one optimization
// profile from the IO specs' ranges; GroupedMM nodes take the blob's kernel
// images. `not_applied` gets each of the blob's options this build does not
// apply, with why. False and *failure if the parser or builder refuses.
bool build_plan(TensorRTLibrary& trt, const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                const BuildRequest& request, std::vector<uint8_t>* plan, std::vector<std::string>* not_applied,
                BuildFailure* failure);

// One line: "summary: error; error".
std::string describe(const BuildFailure& failure);

}  // namespace et_trt
