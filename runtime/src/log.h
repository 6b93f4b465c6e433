// ExecuTorch's log cuts a message at about 256 characters; our messages name
// paths and fixes, so long ones go out as several lines.
#pragma once

#include <executorch/runtime/platform/log.h>

#include <string>

namespace et_trt {

inline void log_error(const std::string& text) {
  constexpr size_t kChunk = 200;
  for (size_t at = 0; at < text.size(); at += kChunk) {
    ET_LOG(Error, "%s%s", at == 0 ? "" : "  ...", text.substr(at, kChunk).c_str());
  }
}

}  // namespace et_trt
