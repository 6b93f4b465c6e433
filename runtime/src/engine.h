// The one interface between the ExecuTorch glue and TensorRT.
//
// Two implementations: tensorrt/ (compiled when CMake is given TensorRT's
// headers, loads libnvinfer with dlopen at init) and engine_unavailable.cc
// (otherwise; every create_engine call explains how to get TensorRT support).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "io_spec.h"
#include "named_data.h"

namespace et_trt {

struct EngineOptions {
  std::string cache_dir;  // where engines built on this machine are kept; empty: no cache
  int device = 0;         // CUDA device ordinal
};

struct EngineError {
  enum class Kind {
    kUnavailable,   // TensorRT, CUDA or a GPU is missing here
    kIncompatible,  // the blob cannot run on this TensorRT or GPU
    kFailed,        // building, deserializing or running failed
  };
  Kind kind = Kind::kFailed;
  std::string message;
};

// One input as the caller holds it: host or device memory.
struct InputTensor {
  const void* data;
  size_t nbytes;
  std::vector<int64_t> shape;
};

// Hands the engine the buffer of output `index` once its shape is known
// (host or device memory, `nbytes` its capacity).
class OutputBuffers {
 public:
  virtual ~OutputBuffers() = default;
  virtual bool resize(size_t index, const std::vector<int64_t>& shape, void** data, size_t* nbytes,
                      std::string* error) = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Runs once and waits for the result. Inputs are already checked against
  // the IO specs. Safe to call from several threads on one engine. On false,
  // *invalid_input says whether the inputs were at fault (a check on the data
  // failed: *error is its message) rather than the run.
  virtual bool execute(const std::vector<InputTensor>& inputs, OutputBuffers& outputs, std::string* error,
                       bool* invalid_input) = 0;
};

// The engine for a verified blob and its fetched named data: the embedded one
// if it fits this GPU and TensorRT, else a cached or newly built one. Neither
// `blob` nor `data` need outlive it.
std::unique_ptr<Engine> create_engine(const BlobView& blob, const PartitionIo& io, const PartitionData& data,
                                      const EngineOptions& options, EngineError* error);

}  // namespace et_trt
