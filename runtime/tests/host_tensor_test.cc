// The runner's input files (.npy, raw), conversions and their error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "host_tensor.h"

namespace et_trt::runner {
namespace {

HostTensor floats(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor t{ScalarType::Float, std::move(shape), std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::string temp_file(const std::string& suffix, const std::vector<uint8_t>& bytes) {
  static int counter = 0;
  const std::string path = "/tmp/et_trt_runner_test_" + std::to_string(::getpid()) + "_" +
                           std::to_string(counter++) + suffix;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return path;
}

TEST(HostTensor, NpyRoundTrips) {
  const HostTensor t = floats({2, 3}, {1, 2, 3, 4, 5, -6.5f});
  HostTensor back;
  ASSERT_EQ(parse_npy(to_npy(t), &back), "");
  EXPECT_EQ(back.dtype, ScalarType::Float);
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.data, t.data);
}

TEST(HostTensor, NpyErrorsSayWhatIsWrong) {
  HostTensor out;
  EXPECT_EQ(parse_npy({1, 2, 3}, &out), "not a .npy file (bad magic)");
  std::vector<uint8_t> npy = to_npy(floats({2}, {1, 2}));
  std::vector<uint8_t> truncated(npy.begin(), npy.end() - 1);
  EXPECT_NE(parse_npy(truncated, &out).find("holds 7 data bytes, shape [2] of fp32 needs 8"), std::string::npos);
  std::vector<uint8_t> short_header(npy.begin(), npy.begin() + 20);
  EXPECT_EQ(parse_npy(short_header, &out), ".npy header truncated");
  std::string text(npy.begin(), npy.end());
  std::string fortran = text;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_NE(parse_npy(std::vector<uint8_t>(fortran.begin(), fortran.end()), &out).find("Fortran order"),
            std::string::npos);
  std::string big_endian = text;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_NE(parse_npy(std::vector<uint8_t>(big_endian.begin(), big_endian.end()), &out).find("'>f4' is not supported"),
            std::string::npos);
  std::vector<uint8_t> v9 = npy;
  v9[6] = 9;
  EXPECT_NE(parse_npy(v9, &out).find("version 9"), std::string::npos);
}

TEST(HostTensor, LoadInputChecksAgainstTheMethod) {
  const std::string npy = temp_file(".npy", to_npy(floats({2, 2}, {1, 2, 3, 4})));
  HostTensor t;
  EXPECT_EQ(load_input(npy, 0, ScalarType::Float, {2, 2}, &t), "");
  EXPECT_NE(load_input(npy, 0, ScalarType::Float, {4}, &t).find("has rank 2, the method's input has rank 1"),
            std::string::npos);
  EXPECT_NE(load_input(npy, 1, ScalarType::Long, {2, 2}, &t).find("input 1 (" + npy + "): dtype fp32, the method's input is int64"),
            std::string::npos);
  // float32 files feed bf16 inputs (numpy has no bf16), rounded to nearest.
  ASSERT_EQ(load_input(npy, 0, ScalarType::BFloat16, {2, 2}, &t), "");
  ASSERT_EQ(t.data.size(), 8u);
  uint16_t first;
  std::memcpy(&first, t.data.data(), 2);
  EXPECT_EQ(first, 0x3f80);
  const std::string raw = temp_file(".bin", std::vector<uint8_t>(12));
  EXPECT_EQ(load_input(raw, 0, ScalarType::Float, {3}, &t), "");
  EXPECT_NE(load_input(raw, 0, ScalarType::Float, {4}, &t).find("raw file holds 12 bytes, the input fp32[4] needs 16"),
            std::string::npos);
  EXPECT_NE(load_input("/no/such/file.npy", 0, ScalarType::Float, {4}, &t).find("cannot open"), std::string::npos);
  std::remove(npy.c_str());
  std::remove(raw.c_str());
}

TEST(HostTensor, HalfConversionsAreExact) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie rounds to even
  for (float v : {0.0f, 1.5f, -3.25f, 1000.0f, std::ldexp(1.0f, -20)}) {
    EXPECT_EQ(fp16_to_float(float_to_fp16(v)), v);
    EXPECT_EQ(bf16_to_float(float_to_bf16(v)), v);
  }
}

TEST(HostTensor, RandomInputsFollowTheSeed) {
  const HostTensor a = random_tensor(ScalarType::BFloat16, {3, 5}, 1);
  EXPECT_EQ(a.data, random_tensor(ScalarType::BFloat16, {3, 5}, 1).data);
  EXPECT_NE(a.data, random_tensor(ScalarType::BFloat16, {3, 5}, 2).data);
  EXPECT_EQ(a.data.size(), 30u);
}

TEST(HostTensor, SummaryCountsNonFinite) {
  const std::string s = summarize(floats({3}, {1, NAN, 3}));
  EXPECT_EQ(s, "fp32[3] min 1 mean 2 max 3 non-finite 1");
}

}  // namespace
}  // namespace et_trt::runner
