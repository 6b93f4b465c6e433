// The delegate's log lines, through ExecuTorch's log. ExecuTorch cuts a
// message at 254 bytes and its Python log sink aborts the process on text
// that is not UTF-8, so every line goes out as valid UTF-8 (blob strings,
// paths, environment values and TensorRT's messages can hold anything), and
// a long one as several lines cut between characters.
#pragma once

#include <executorch/runtime/platform/log.h>

#include <string>

#include "utf8.h"

namespace et_trt {

// Bytes per line: ExecuTorch's limit less the continuation mark, with room to spare.
constexpr size_t kLogPieceBytes = 200;

// Calls emit(mark, piece) for each line of `text`: mark is "" for the first, "  ..." after.
template <typename Emit>
void for_each_log_line(const std::string& text, Emit emit) {
  const char* mark = "";
  for (const std::string& piece : utf8_pieces(valid_utf8(text), kLogPieceBytes)) {
    emit(mark, piece.c_str());
    mark = "  ...";
  }
}

inline void log_error(const std::string& text) {
  for_each_log_line(text, [](const char* mark, const char* piece) { ET_LOG(Error, "%s%s", mark, piece); });
}

inline void log_info(const std::string& text) {
  for_each_log_line(text, [](const char* mark, const char* piece) { ET_LOG(Info, "%s%s", mark, piece); });
}

}  // namespace et_trt
