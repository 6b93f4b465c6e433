// Checks an ExecuTorch data file (.ptd) before ExecuTorch reads it.
//
// ExecuTorch 1.5 reads a .ptd's flatbuffer without the flatbuffers Verifier
// and follows its offsets unchecked (extension/flat_tensor/
// flat_tensor_data_map.cpp), so a damaged file can crash the process that
// loads it. Call this first on every .ptd your program hands to ExecuTorch:
//
//   std::string error;
//   if (!et_trt::verify_data_file("policy.ptd", &error)) {
//     std::fprintf(stderr, "%s\n", error.c_str());
//     return 1;
//   }
//   executorch::extension::Module module("policy.pte", "policy.ptd");
//
// Installed with libet_trt_runtime.so (include/et_trt/data_file.h), which
// defines it.
#pragma once

#include <string>

namespace et_trt {

// True if `path` is an ExecuTorch data file whose structure ExecuTorch can
// read without going out of bounds: its header, its flatbuffer (the flatbuffers
// Verifier against ExecuTorch's flat_tensor schema), every key (UTF-8 text),
// every tensor layout, and every segment inside the file. The named data's
// bytes are not read: the delegate checks each one's size and sha256 at init.
// Otherwise false, and `error` (if given) gets one line naming the file and
// what is wrong.
__attribute__((visibility("default"))) bool verify_data_file(const std::string& path, std::string* error = nullptr);

}  // namespace et_trt
