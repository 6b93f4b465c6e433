// C entry points of libet_trt_runtime.so for Python (et_trt_backend.runtime):
// data files are checked as et_trt_runner checks them. (The engine builder's
// entries are in libet_trt_plugin.so: tensorrt/builder_capi.h.)
#include <cstdint>
#include <cstdio>
#include <string>

#include "et_trt/data_file.h"

extern "C" {

// et_trt::verify_data_file for Python (et_trt_backend.runtime.verify_data_file): 0 if the .ptd at `path` is safe
// to hand to ExecuTorch, else 1 with the one-line reason in `error`.
__attribute__((visibility("default"))) int32_t et_trt_verify_data_file(const char* path, char* error,
                                                                        size_t error_size) {
  std::string message;
  if (et_trt::verify_data_file(path, &message)) return 0;
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
  return 1;
}

}  // extern "C"
