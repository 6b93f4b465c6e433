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

struct PartitionIo {
  std::vector<IoSpec> inputs;
  std::vector<IoSpec> outputs;
};

PartitionIo partition_io(const blob::Blob& blob);

// Empty if `shape` of a tensor of `dtype` fits `spec`; else a message naming
// the tensor, what was expected and what was given.
std::string check_tensor(const IoSpec& spec, blob::DType dtype, const std::vector<int64_t>& shape);

std::string shape_string(const std::vector<int64_t>& shape);
std::string spec_string(const IoSpec& spec);

}  // namespace et_trt
