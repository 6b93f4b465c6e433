// The IO description of one partition, copied out of the blob at init so the
// blob can be freed, and the run-time checks of actual inputs against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blob_reader.h"

namespace et_trt {

struct DimRange {
  int64_t size;  // -1: dynamic
  std::string name;
  int64_t min, opt, max;
};

struct IoSpec {
  std::string name;
  blob::DType dtype;
  std::vector<DimRange> dims;
};

// A check on the data (blob table Check): a bool scalar output of the engine
// that is not a delegate output; a call whose check is false fails with `message`.
struct CheckSpec {
  std::string output;
  std::string message;
};

struct PartitionIo {
  std::vector<IoSpec> inputs;
  std::vector<IoSpec> outputs;
  std::vector<CheckSpec> checks;
};

PartitionIo partition_io(const blob::Blob& blob);

// Empty if `shape` of a tensor of `dtype` fits `spec`; else a message naming
// the tensor, what was expected and what was given.
std::string check_tensor(const IoSpec& spec, blob::DType dtype, const std::vector<int64_t>& shape);

// One input argument of a delegate call, as far as matching needs to know it.
// Where partitions share a dynamic size (e.g. the token count), ExecuTorch
// computes it once and passes it to each delegate as an Int argument next to
// the tensors; the blob lists only the tensor arguments, because the engine
// recomputes sizes from its inputs' shapes.
struct CallArg {
  enum class Kind { kTensor, kInt, kOther };
  Kind kind;
  std::string type;  // what the caller passed, for messages (e.g. "Double")
};

// Matches a delegate call's input arguments (those before its outputs) to the
// blob's `inputs`: Int arguments are skipped, tensors are taken in order. On
// success `tensor_args[i]` is the argument index feeding blob input i; else
// false with `error` naming the problem (an argument kind the delegate cannot
// take, or a tensor count other than the blob's input count).
bool match_call_inputs(const std::vector<CallArg>& args, const std::vector<IoSpec>& inputs,
                       std::vector<size_t>* tensor_args, std::string* error);

std::string shape_string(const std::vector<int64_t>& shape);
std::string spec_string(const IoSpec& spec);

}  // namespace et_trt
