// Engine cache directory, key and atomic write/read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine_cache.h"

namespace et_trt {
namespace {

TEST(EngineCache, DirectoryComesFromOptionThenEnvironment) {
  ::setenv("ET_TRT_ENGINE_CACHE", "/from/env", 1);
  EXPECT_EQ(engine_cache_dir("/from/option"), "/from/option");
  EXPECT_EQ(engine_cache_dir(nullptr), "/from/env");
  ::unsetenv("ET_TRT_ENGINE_CACHE");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(engine_cache_dir(""), "/xdg/et_trt/engines");
  ::unsetenv("XDG_CACHE_HOME");
}

TEST(EngineCache, KeySeparatesContentGpuAndTensorRT) {
  constexpr Provider kTrt = Provider::kTensorRT;
  const std::string key = engine_cache_key("ab12", "NVIDIA H200", 90, kTrt, "10.13.0");
  EXPECT_EQ(key, "ab12-NVIDIA_H200-sm90-trt10.13.0.engine");
  EXPECT_NE(key, engine_cache_key("ab13", "NVIDIA H200", 90, kTrt, "10.13.0"));
  EXPECT_NE(key, engine_cache_key("ab12", "NVIDIA H100", 90, kTrt, "10.13.0"));
  EXPECT_NE(key, engine_cache_key("ab12", "NVIDIA H200", 90, kTrt, "10.14.0"));
  EXPECT_EQ(engine_cache_key("x", "../../etc/passwd", 87, kTrt, "1").find('/'), std::string::npos);
  // The provider is named: a TensorRT for RTX engine never passes for a TensorRT one.
  const std::string rtx = engine_cache_key("ab12", "NVIDIA GeForce RTX 4090", 89, Provider::kTensorRTRTX, "1.7.1.116");
  EXPECT_EQ(rtx, "ab12-NVIDIA_GeForce_RTX_4090-sm89-rtx1.7.1.116.engine");
  EXPECT_EQ(runtime_cache_key(rtx), "ab12-NVIDIA_GeForce_RTX_4090-sm89-rtx1.7.1.116.runtime-cache");
}

TEST(EngineCache, WritesAtomicallyAndReadsBack) {
  char tmpl[] = "/tmp/et_trt_cache_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/nested/dir";
  std::vector<uint8_t> plan;
  EXPECT_FALSE(read_cached_engine(dir, "k.engine", &plan));
  const std::vector<uint8_t> written = {1, 2, 3, 250};
  std::string error;
  ASSERT_TRUE(write_cached_engine(dir, "k.engine", written.data(), written.size(), &error)) << error;
  ASSERT_TRUE(read_cached_engine(dir, "k.engine", &plan));
  EXPECT_EQ(plan, written);
  EXPECT_FALSE(write_cached_engine("", "k.engine", written.data(), written.size(), &error));
  EXPECT_FALSE(write_cached_engine("/proc/no_such_dir", "k.engine", written.data(), written.size(), &error));
  EXPECT_NE(error.find("cannot"), std::string::npos) << error;
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace et_trt
