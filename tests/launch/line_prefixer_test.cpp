// LinePrefixer: whole prefixed lines out of arbitrarily cut chunks, with '\r' progress updates
// passed through at once (Note [Carriage returns]) and a last partial line flushed on finish.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtorch/launch/line_prefixer.h"

namespace dtorch::launch {
namespace {

std::string feed_all(LinePrefixer& p, const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks)
    p.feed(c, out);
  return out;
}

TEST(LinePrefixer, RankPrefixFormat) {
  EXPECT_EQ(rank_prefix(0, 1), "[n0 r1] ");
  EXPECT_EQ(rank_prefix(3, 25), "[n3 r25] ");
  EXPECT_EQ(rank_prefix(1, 3, "gpu17"), "[gpu17 n1 r3] ");
}

TEST(LinePrefixer, PrefixesEachNewlineLine) {
  LinePrefixer p("[p] ");
  EXPECT_EQ(feed_all(p, {"a\nbb\n\nccc\n"}), "[p] a\n[p] bb\n[p] \n[p] ccc\n");
  EXPECT_FALSE(p.has_partial());
}

TEST(LinePrefixer, HoldsPartialLinesAcrossChunks) {
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("hel", out);
  EXPECT_EQ(out, "");
  EXPECT_TRUE(p.has_partial());
  p.feed("lo wo", out);
  EXPECT_EQ(out, "");
  p.feed("rld\nnext", out);
  EXPECT_EQ(out, "[p] hello world\n");
  p.feed("\n", out);
  EXPECT_EQ(out, "[p] hello world\n[p] next\n");
}

TEST(LinePrefixer, OneByteChunksGiveTheSameLines) {
  std::string text = "first\nx\r\n\nsecond line\r\nlast\n";
  LinePrefixer whole("[p] "), bytes("[p] ");
  std::string a, b;
  whole.feed(text, a);
  for (char c : text)
    bytes.feed(std::string(1, c), b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, "[p] first\n[p] x\r\n[p] \n[p] second line\r\n[p] last\n");
}

TEST(LinePrefixer, CarriageReturnUpdatesPassAtOnce) {
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("epoch 1:  10%\r", out);
  EXPECT_EQ(out, "[p] epoch 1:  10%\r");  // not held back until the final newline
  p.feed("epoch 1:  50%\repoch 1: 100%\n", out);
  EXPECT_EQ(out, "[p] epoch 1:  10%\r[p] epoch 1:  50%\r[p] epoch 1: 100%\n");
}

TEST(LinePrefixer, LeadingCarriageReturnUpdatesShowAtOnce) {
  // tqdm-style (and dtorch's progress bar): every update starts with '\r', so an update is
  // complete long before its terminator arrives with the next one.
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("\r 10%", out);
  EXPECT_EQ(out, "\r[p]  10%\r");  // shown now, not one update late
  p.feed("\r 20", out);
  p.feed("%", out);  // the same update, split across reads: redrawn whole
  EXPECT_EQ(out, "\r[p]  10%\r[p]  20\r[p]  20%\r");
  p.feed("\r 30%\n", out);  // the final state ends the line
  EXPECT_EQ(out, "\r[p]  10%\r[p]  20\r[p]  20%\r[p]  30%\n");
  EXPECT_FALSE(p.has_partial());
}

TEST(LinePrefixer, OrdinaryLinesWaitForTheirEnd) {
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("done\nnot finis", out);  // after '\n': not a progress update, held back whole
  EXPECT_EQ(out, "[p] done\n");
  p.feed("hed\n", out);
  EXPECT_EQ(out, "[p] done\n[p] not finished\n");
}

TEST(LinePrefixer, CrLfIsOneLineEndEvenWhenSplit) {
  LinePrefixer p("[p] ");
  EXPECT_EQ(feed_all(p, {"a\r\nb\r", "\nc\n"}), "[p] a\r\n[p] b\r\n[p] c\n");
}

TEST(LinePrefixer, FinishFlushesThePartialLineWithNewline) {
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("done\nno newline at end", out);
  p.finish(out);
  EXPECT_EQ(out, "[p] done\n[p] no newline at end\n");
  EXPECT_FALSE(p.has_partial());
  std::string again;
  p.finish(again);
  EXPECT_EQ(again, "");  // nothing held: nothing added
}

TEST(LinePrefixer, FinishAfterCompleteLinesAddsNothing) {
  LinePrefixer p("[p] ");
  std::string out;
  p.feed("a\n", out);
  p.finish(out);
  EXPECT_EQ(out, "[p] a\n");
}

TEST(LinePrefixer, CutsOverlongLines) {
  LinePrefixer p("[p] ", 4);
  EXPECT_EQ(feed_all(p, {"abcdefghij\n"}), "[p] abcd\n[p] efgh\n[p] ij\n");
  LinePrefixer q("[p] ", 4);
  EXPECT_EQ(feed_all(q, {"ab", "cd", "\n"}), "[p] abcd\n");  // exactly max_line is not cut
}

}  // namespace
}  // namespace dtorch::launch
