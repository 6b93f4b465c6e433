// UTF-8 text for ExecuTorch's log: its Python sink throws on anything else,
// which aborts the process, so every line we hand it must be whole, valid
// UTF-8 (blob strings, paths, environment values, TensorRT's messages).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace et_trt {

// True if `text` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF: what Python's strict decoder accepts).
bool is_utf8(std::string_view text);

// `text` with every byte that does not start a well-formed sequence replaced
// by U+FFFD.
std::string valid_utf8(std::string_view text);

// `text` (valid UTF-8) cut into pieces of at most `max_bytes` bytes, never
// inside a character. `max_bytes` must be at least 4.
std::vector<std::string> utf8_pieces(std::string_view text, size_t max_bytes);

}  // namespace et_trt
