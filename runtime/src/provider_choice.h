// Which engine provider serves a blob: TensorRT (libnvinfer) or TensorRT for
// RTX (libtensorrt_rtx), decided at init from the blob's engine records, what
// is installed here and $ET_TRT_PROVIDER. Pure: no TensorRT, unit-tested.
#pragma once

#include <string>

#include "schema_generated.h"

namespace et_trt {

enum class Provider { kTensorRT, kTensorRTRTX };

// "TensorRT" / "TensorRT for RTX".
const char* provider_name(Provider provider);

// $ET_TRT_PROVIDER: tensorrt, tensorrt-rtx or auto (the default).
enum class ProviderPreference { kAuto, kTensorRT, kTensorRTRTX };
bool parse_provider_preference(const char* text, ProviderPreference* preference, std::string* error);

// What is installed here: for each provider, empty if it loads, else why not.
struct InstalledProviders {
  std::string tensorrt_missing;
  std::string rtx_missing;
  bool has(Provider p) const { return (p == Provider::kTensorRT ? tensorrt_missing : rtx_missing).empty(); }
};

struct ProviderChoice {
  bool ok = false;
  Provider provider = Provider::kTensorRT;
  std::string reason;  // why this provider, or (not ok) what is missing
};

// auto: the provider of the blob's first engine record whose provider is
// installed (its engine may fit this GPU); else TensorRT, else TensorRT for
// RTX, building from the ONNX. A named preference takes that provider or
// refuses. A refusal names what is missing.
ProviderChoice choose_provider(const blob::Blob& blob, ProviderPreference preference,
                               const InstalledProviders& installed);

}  // namespace et_trt
