// On-disk cache of engines built on this machine from a blob's ONNX.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "provider_choice.h"

namespace et_trt {

// Directory: the load-time option if given, else $ET_TRT_ENGINE_CACHE, else
// $XDG_CACHE_HOME/et_trt/engines or ~/.cache/et_trt/engines; empty if none
// of these is set (no caching).
std::string engine_cache_dir(const char* load_option);

// File name for an engine: blob content id + GPU + provider and its version,
// so a changed model, another GPU model or another TensorRT (or TensorRT for
// RTX) never reuses it: "<id>-<gpu>-sm<cc>-trt<version>.engine" ("-rtx" for
// TensorRT for RTX).
std::string engine_cache_key(const std::string& content_id_hex, const std::string& gpu_name,
                             int compute_capability, Provider provider, const std::string& provider_version);

// TensorRT for RTX's runtime cache (kernels compiled at run time) of the
// engine cached as `engine_key`, kept beside it: "<id>-...-rtx<version>.runtime-cache".
std::string runtime_cache_key(const std::string& engine_key);

// False if there is no such entry (or it cannot be read).
bool read_cached_engine(const std::string& dir, const std::string& key, std::vector<uint8_t>* plan);

// Writes to a temporary file and renames it, so readers never see half an
// engine; creates `dir` as needed.
bool write_cached_engine(const std::string& dir, const std::string& key, const void* plan, size_t size,
                         std::string* error);

}  // namespace et_trt
