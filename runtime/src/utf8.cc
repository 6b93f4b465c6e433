#include "utf8.h"

#include <algorithm>

namespace et_trt {
namespace {

// Length of the well-formed sequence at text[at], or 0 if there is none
// (RFC 3629's table: the second byte's range depends on the first).
size_t sequence_length(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char first = byte(at);
  if (first < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (first >= 0xC2 && first <= 0xDF) {
    length = 2;
  } else if (first >= 0xE0 && first <= 0xEF) {
    length = 3;
    if (first == 0xE0) low = 0xA0;   // overlong
    if (first == 0xED) high = 0x9F;  // surrogates
  } else if (first >= 0xF0 && first <= 0xF4) {
    length = 4;
    if (first == 0xF0) low = 0x90;   // overlong
    if (first == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

bool is_utf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = sequence_length(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const size_t length = sequence_length(text, at);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++at;
    } else {
      out.append(text.substr(at, length));
      at += length;
    }
  }
  return out;
}

std::vector<std::string> utf8_pieces(std::string_view text, size_t max_bytes) {
  std::vector<std::string> pieces;
  for (size_t at = 0; at < text.size();) {
    size_t end = std::min(text.size(), at + max_bytes);
    // Back off continuation bytes (10xxxxxx): the cut lands before a character's first byte.
    while (end < text.size() && end > at && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    if (end == at) end = std::min(text.size(), at + max_bytes);  // `text` is not UTF-8: cut anyway
    pieces.emplace_back(text.substr(at, end - at));
    at = end;
  }
  return pieces;
}

}  // namespace et_trt
