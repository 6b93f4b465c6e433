// Builds a TensorRT (or TensorRT for RTX) engine from a blob's ONNX: the
// compiler half of the engine (engine_selection.cc decides when to build).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "io_spec.h"
#include "named_data.h"
#include "tensorrt_library.h"

namespace et_trt {

// Builds a serialized engine from the blob's ONNX and weights (`data`, the
// blob's fetched named data) with its BuildOptions, one optimization profile
// from the IO specs' ranges and the timing cache at `timing_cache_path` (read
// and updated; empty: none); false and *error (what TensorRT refused) if it
// cannot. Runs in the caller's current CUDA context.
bool build_plan(TensorRTLibrary& trt, const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                const std::string& timing_cache_path, std::vector<uint8_t>* plan, std::string* error);

}  // namespace et_trt
