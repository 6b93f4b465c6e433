// The provider decision at init, over blobs with and without engine records
// and machines with TensorRT, TensorRT for RTX, both or neither.
#include <gtest/gtest.h>

#include "provider_choice.h"

namespace et_trt {
namespace {

// A blob payload whose engine records have these providers (sm86 each).
std::vector<uint8_t> blob_with_engines(const std::vector<blob::Provider>& providers) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<blob::Engine>> engines;
  const std::vector<uint8_t> sha256(32, 1);
  for (blob::Provider p : providers) {
    auto plan = blob::CreateNamedDataDirect(fbb, "et_trt/01", 3, &sha256);
    engines.push_back(blob::CreateEngineDirect(fbb, plan, p, "1.7.1.116", "", 86));
  }
  fbb.Finish(blob::CreateBlobDirect(fbb, "velocity", 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr,
                                    &engines));
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

const InstalledProviders kNeither{"cannot load libnvinfer.so.11", "cannot load libtensorrt_rtx.so.1"};
const InstalledProviders kTensorRTOnly{"", "cannot load libtensorrt_rtx.so.1"};
const InstalledProviders kRtxOnly{"cannot load libnvinfer.so.11", ""};
const InstalledProviders kBoth{"", ""};

ProviderChoice choose(const std::vector<blob::Provider>& engines, const InstalledProviders& installed,
                      ProviderPreference preference = ProviderPreference::kAuto) {
  const std::vector<uint8_t> bytes = blob_with_engines(engines);
  return choose_provider(*blob::GetBlob(bytes.data()), preference, installed);
}

TEST(ProviderChoice, WithoutEnginesTensorRTFirstThenRtx) {
  ProviderChoice c = choose({}, kBoth);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRT);
  EXPECT_EQ(c.reason, "the blob carries no engine; TensorRT is installed and builds it from the ONNX");
  c = choose({}, kRtxOnly);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRTRTX);
  EXPECT_NE(c.reason.find("TensorRT for RTX is installed and builds it from the ONNX"), std::string::npos);
}

TEST(ProviderChoice, AnEngineRecordPicksItsInstalledProvider) {
  ProviderChoice c = choose({blob::Provider::TensorRTRTX}, kBoth);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRTRTX);
  EXPECT_EQ(c.reason, "the blob carries a TensorRT for RTX engine (sm86) and TensorRT for RTX is installed");
  c = choose({blob::Provider::TensorRTRTX, blob::Provider::TensorRT}, kTensorRTOnly);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRT);
  EXPECT_NE(c.reason.find("carries a TensorRT engine"), std::string::npos);
}

TEST(ProviderChoice, EnginesOfAProviderNotInstalledFallBackToTheOnnx) {
  ProviderChoice c = choose({blob::Provider::TensorRT}, kRtxOnly);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRTRTX);
  EXPECT_EQ(c.reason, "none of the blob's engines is for an installed provider; TensorRT for RTX is installed and "
                      "builds it from the ONNX");
}

TEST(ProviderChoice, NeitherInstalledNamesBothMissingLibraries) {
  for (const auto& engines : {std::vector<blob::Provider>{}, std::vector<blob::Provider>{blob::Provider::TensorRT}}) {
    const ProviderChoice c = choose(engines, kNeither);
    EXPECT_FALSE(c.ok);
    EXPECT_EQ(c.reason, "no engine provider is installed: TensorRT: cannot load libnvinfer.so.11; TensorRT for RTX: "
                        "cannot load libtensorrt_rtx.so.1");
  }
}

TEST(ProviderChoice, APreferenceIsHonouredOrRefusedNamingWhatIsMissing) {
  ProviderChoice c = choose({blob::Provider::TensorRTRTX}, kBoth, ProviderPreference::kTensorRT);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.provider, Provider::kTensorRT);
  EXPECT_EQ(c.reason, "ET_TRT_PROVIDER=tensorrt");
  c = choose({}, kTensorRTOnly, ProviderPreference::kTensorRTRTX);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason, "ET_TRT_PROVIDER=tensorrt-rtx asks for TensorRT for RTX, which is not available here: cannot "
                      "load libtensorrt_rtx.so.1");
  c = choose({blob::Provider::TensorRT}, kRtxOnly, ProviderPreference::kTensorRT);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.reason.find("asks for TensorRT, which is not available here: cannot load libnvinfer.so.11"),
            std::string::npos);
}

TEST(ProviderChoice, ParsesTheEnvironmentValue) {
  ProviderPreference p;
  std::string error;
  ASSERT_TRUE(parse_provider_preference(nullptr, &p, &error));
  EXPECT_EQ(p, ProviderPreference::kAuto);
  ASSERT_TRUE(parse_provider_preference("tensorrt-rtx", &p, &error));
  EXPECT_EQ(p, ProviderPreference::kTensorRTRTX);
  ASSERT_TRUE(parse_provider_preference("tensorrt", &p, &error));
  EXPECT_EQ(p, ProviderPreference::kTensorRT);
  EXPECT_FALSE(parse_provider_preference("rtx", &p, &error));
  EXPECT_EQ(error, "ET_TRT_PROVIDER='rtx' is not one of tensorrt, tensorrt-rtx, auto");
}

}  // namespace
}  // namespace et_trt
