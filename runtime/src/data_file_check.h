// The structural check behind et_trt::verify_data_file (include/et_trt/data_file.h),
// on a data file's bytes in memory: for the corruption tests, which feed it
// thousands of mutants without writing files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace et_trt {

// Size of ExecuTorch's FlatTensor header region: it reads this many bytes first.
constexpr size_t kDataFileHeadBytes = 64;
// The newest FlatTensor schema version ExecuTorch 1.5 reads (FlatTensorDataMap::kMaxSupportedSchemaVersion,
// which tests/ptd_corruption.cc checks this against).
constexpr uint32_t kDataFileSchemaVersion = 0;

// True if the `size` bytes at `data` (a whole .ptd, 8-byte aligned) are safe
// for ExecuTorch's FlatTensorDataMap; otherwise false with `problem` saying
// what is wrong, in words that follow "<path>: ".
bool check_data_file(const uint8_t* data, size_t size, std::string* problem);

}  // namespace et_trt
