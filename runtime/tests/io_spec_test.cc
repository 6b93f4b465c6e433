// Run-time checks of actual inputs against a partition's IO specs.
#include <gtest/gtest.h>

#include "io_spec.h"

namespace et_trt {
namespace {

IoSpec tokens_by_16() {
  return {"obs", blob::DType::BFloat16, {{-1, "tokens", 2, 64, 512}, {16, "obs:1", 16, 16, 16}}};
}

TEST(IoSpec, AcceptsShapesInsideTheProfile) {
  EXPECT_EQ(check_tensor(tokens_by_16(), blob::DType::BFloat16, {2, 16}), "");
  EXPECT_EQ(check_tensor(tokens_by_16(), blob::DType::BFloat16, {512, 16}), "");
}

TEST(IoSpec, RefusesWrongDtypeNamingBoth) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::Float32, {8, 16});
  EXPECT_NE(e.find("input 'obs': dtype fp32 where the engine takes bf16"), std::string::npos) << e;
}

TEST(IoSpec, RefusesWrongRank) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {8, 16, 1});
  EXPECT_NE(e.find("rank 3 where the engine takes rank 2"), std::string::npos) << e;
}

TEST(IoSpec, RefusesDynamicDimOutsideItsRange) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {513, 16});
  EXPECT_NE(e.find("dim 0 is 513 outside the exported range [2, 512] of 'tokens'"), std::string::npos) << e;
  EXPECT_NE(e.find("shape_ranges"), std::string::npos) << e;
  EXPECT_NE(check_tensor(tokens_by_16(), blob::DType::BFloat16, {1, 16}), "");
}

TEST(IoSpec, RefusesStaticDimMismatch) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {8, 15});
  EXPECT_NE(e.find("dim 1 is 15 where the engine takes exactly 16"), std::string::npos) << e;
  EXPECT_NE(e.find("expected bf16[tokens in 2..512, 16], got bf16[8, 15]"), std::string::npos) << e;
}

}  // namespace
}  // namespace et_trt
