// UTF-8 checks, replacement and cutting (src/utf8.h): what the delegate's log
// lines go through before ExecuTorch's log, whose Python sink aborts on
// anything but whole UTF-8.
#include <gtest/gtest.h>

#include "utf8.h"

namespace et_trt {
namespace {

TEST(Utf8, AcceptsWhatPythonsStrictDecoderAccepts) {
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("ascii"));
  EXPECT_TRUE(is_utf8("\xC3\xA9"));           // é
  EXPECT_TRUE(is_utf8("\xD0\xBF\xD0\xBE"));   // по
  EXPECT_TRUE(is_utf8("\xE2\x82\xAC"));       // €
  EXPECT_TRUE(is_utf8("\xF0\x9F\xA4\x96"));   // 🤖
  EXPECT_TRUE(is_utf8("\xF4\x8F\xBF\xBF"));   // U+10FFFF
  EXPECT_TRUE(is_utf8(std::string("a\0b", 3)));
}

TEST(Utf8, RefusesCutsOverlongsSurrogatesAndStrayBytes) {
  for (const char* bad : {"\xC3", "\xE2\x82", "\xF0\x9F\xA4", "\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF",
                          "\xF0\x80\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80",
                          "\xBF", "\xFF", "a\xC3" "b"}) {
    EXPECT_FALSE(is_utf8(bad)) << testing::PrintToString(bad);
  }
}

TEST(Utf8, ReplacesEachBadByteAndKeepsTheRest) {
  EXPECT_EQ(valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(valid_utf8("x\xC3"), "x\xEF\xBF\xBD");
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(is_utf8(valid_utf8("\xF0\x9F\xA4\xE2\x82\xC3\x80\xFF")));
}

TEST(Utf8, PiecesNeverCutACharacterAtAnyOffset) {
  // Two- and four-byte characters at every offset relative to the cut.
  for (const std::string wide : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\xA4\x96"}) {
    for (size_t lead = 0; lead < 12; ++lead) {
      std::string text(lead, 'a');
      for (int i = 0; i < 60; ++i) text += wide;
      std::string joined;
      for (const std::string& piece : utf8_pieces(text, 10)) {
        EXPECT_LE(piece.size(), 10u);
        EXPECT_FALSE(piece.empty());
        EXPECT_TRUE(is_utf8(piece)) << "lead " << lead << ": " << piece;
        joined += piece;
      }
      EXPECT_EQ(joined, text);
    }
  }
  EXPECT_TRUE(utf8_pieces("", 10).empty());
}

}  // namespace
}  // namespace et_trt
