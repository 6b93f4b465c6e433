#include "provider_choice.h"

#include <cstring>

namespace et_trt {
namespace {

Provider of(blob::Provider p) { return p == blob::Provider::TensorRTRTX ? Provider::kTensorRTRTX : Provider::kTensorRT; }

std::string missing(const InstalledProviders& installed, Provider p) {
  return p == Provider::kTensorRT ? installed.tensorrt_missing : installed.rtx_missing;
}

}  // namespace

const char* provider_name(Provider provider) {
  return provider == Provider::kTensorRT ? "TensorRT" : "TensorRT for RTX";
}

bool parse_provider_preference(const char* text, ProviderPreference* preference, std::string* error) {
  if (text == nullptr || text[0] == '\0' || std::strcmp(text, "auto") == 0) {
    *preference = ProviderPreference::kAuto;
  } else if (std::strcmp(text, "tensorrt") == 0) {
    *preference = ProviderPreference::kTensorRT;
  } else if (std::strcmp(text, "tensorrt-rtx") == 0) {
    *preference = ProviderPreference::kTensorRTRTX;
  } else {
    *error = std::string("ET_TRT_PROVIDER='") + text + "' is not one of tensorrt, tensorrt-rtx, auto";
    return false;
  }
  return true;
}

ProviderChoice choose_provider(const blob::Blob& blob, ProviderPreference preference,
                               const InstalledProviders& installed) {
  ProviderChoice choice;
  if (preference != ProviderPreference::kAuto) {
    const Provider p = preference == ProviderPreference::kTensorRT ? Provider::kTensorRT : Provider::kTensorRTRTX;
    const char* value = p == Provider::kTensorRT ? "tensorrt" : "tensorrt-rtx";
    choice.provider = p;
    choice.ok = installed.has(p);
    choice.reason = choice.ok ? std::string("ET_TRT_PROVIDER=") + value
                              : std::string("ET_TRT_PROVIDER=") + value + " asks for " + provider_name(p) +
                                    ", which is not available here: " + missing(installed, p);
    return choice;
  }
  const auto* engines = blob.engines();
  for (flatbuffers::uoffset_t i = 0; engines != nullptr && i < engines->size(); ++i) {
    const Provider p = of(engines->Get(i)->provider());
    if (installed.has(p)) {
      choice.ok = true;
      choice.provider = p;
      choice.reason = std::string("the blob carries a ") + provider_name(p) + " engine (sm" +
                      std::to_string(engines->Get(i)->compute_capability()) + ") and " + provider_name(p) +
                      " is installed";
      return choice;
    }
  }
  const std::string engines_note = engines != nullptr && engines->size() > 0
                                       ? "none of the blob's engines is for an installed provider"
                                       : "the blob carries no engine";
  for (Provider p : {Provider::kTensorRT, Provider::kTensorRTRTX}) {
    if (installed.has(p)) {
      choice.ok = true;
      choice.provider = p;
      choice.reason = engines_note + "; " + provider_name(p) + " is installed and builds it from the ONNX";
      return choice;
    }
  }
  choice.reason = "no engine provider is installed: TensorRT: " + installed.tensorrt_missing +
                  "; TensorRT for RTX: " + installed.rtx_missing;
  return choice;
}

}  // namespace et_trt
