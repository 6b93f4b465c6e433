// Host tensors for the runner: .npy and raw files in, random fill, .npy out,
// and a one-line summary of an output.
#pragma once

#include <executorch/runtime/core/exec_aten/exec_aten.h>

#include <cstdint>
#include <string>
#include <vector>

namespace et_trt::runner {

using executorch::aten::ScalarType;

struct HostTensor {
  ScalarType dtype = ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

size_t element_size(ScalarType dtype);  // 0: not supported by the runner
const char* dtype_name(ScalarType dtype);

// Parses a .npy file's bytes (format 1.0-3.0, C order, little-endian).
// Empty on success, else what is wrong.
std::string parse_npy(const std::vector<uint8_t>& bytes, HostTensor* out);
std::vector<uint8_t> to_npy(const HostTensor& tensor);

// The tensor for method input `index` of `dtype` and `shape` from `file`:
// a .npy must have that shape and that dtype (float32 is converted to
// bf16/fp16 inputs); a raw file must hold exactly the bytes.
std::string load_input(const std::string& file, size_t index, ScalarType dtype, const std::vector<int64_t>& shape,
                       HostTensor* out);

// Uniform in [-1, 1) for floats, [0, 8) for integers, coin flips for bool.
HostTensor random_tensor(ScalarType dtype, const std::vector<int64_t>& shape, uint64_t seed);

// dtype, shape, min/mean/max and the count of NaN/Inf values.
std::string summarize(const HostTensor& tensor);

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);

}  // namespace et_trt::runner
