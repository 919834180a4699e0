// Tests for the IDX reader: raw and gzipped files of any size, and a clear DataError naming
// the file for every way a file can be missing or broken.
#include "dtorch/data/idx.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/idx_writer.h"
#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::data {
namespace {

using dtorch::testing::idx_bytes;
using dtorch::testing::pattern;

// Expects read_idx(path) to throw DataError whose message names the file and contains `what`.
void expect_data_error(const std::string& path, const std::string& what) {
  try {
    read_idx(path);
    FAIL() << "no error reading " << path;
  } catch (const DataError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(DataIdx, ReadsRawFileShapedByHeader) {
  auto dir = dtorch::testing::scratch_dir("idx-raw");
  auto data = pattern(7 * 5 * 4);
  dtorch::testing::write_bytes(dir + "/a", idx_bytes({7, 5, 4}, data));
  torch::Tensor t = read_idx(dir + "/a");
  EXPECT_EQ(t.scalar_type(), torch::kUInt8);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{7, 5, 4}));
  auto flat = t.flatten();
  for (size_t i = 0; i < data.size(); ++i)
    ASSERT_EQ(flat[i].item<uint8_t>(), data[i]) << i;
}

TEST(DataIdx, ReadsGzippedFileAndOneDimensionalLabels) {
  auto dir = dtorch::testing::scratch_dir("idx-gz");
  auto data = pattern(13, 7);
  dtorch::testing::write_gzip(dir + "/labels.gz", idx_bytes({13}, data));
  torch::Tensor t = read_idx(dir + "/labels.gz");
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{13}));
  EXPECT_TRUE(torch::equal(
      t, torch::tensor(std::vector<int64_t>(data.begin(), data.end())).to(torch::kUInt8)));
}

TEST(DataIdx, EmptyDatasetIsFine) {
  auto dir = dtorch::testing::scratch_dir("idx-empty");
  dtorch::testing::write_bytes(dir + "/e", idx_bytes({0, 28, 28}, {}));
  EXPECT_EQ(read_idx(dir + "/e").sizes(), (std::vector<int64_t>{0, 28, 28}));
  // A fuzzer's header: no data, but the other dimensions' strides would overflow int64.
  dtorch::testing::write_bytes(dir + "/huge",
                               idx_bytes({0, 0x3cef2717, 0xb2ee4f0d, 0xbe3bdabe, 0xedce37ac}, {}));
  expect_data_error(dir + "/huge", "dimensions no data set has");
}

// The first items of a file: the same bytes as the whole file's first rows, the header's count
// beside them, and nothing after them read (so not checked either).
TEST(DataIdx, ReadsTheFirstItemsOnly) {
  auto dir = dtorch::testing::scratch_dir("idx-first");
  auto data = pattern(7 * 5 * 4);
  auto bytes = idx_bytes({7, 5, 4}, data);
  dtorch::testing::write_gzip(dir + "/a.gz", bytes);
  const torch::Tensor whole = read_idx(dir + "/a.gz");
  int64_t items = 0;
  const torch::Tensor first = read_idx(dir + "/a.gz", 3, &items);
  EXPECT_EQ(items, 7);
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{3, 5, 4}));
  EXPECT_TRUE(torch::equal(first, whole.slice(0, 0, 3)));
  EXPECT_EQ(read_idx(dir + "/a.gz", 0).sizes(), (std::vector<int64_t>{0, 5, 4}));
  EXPECT_TRUE(torch::equal(read_idx(dir + "/a.gz", 7), whole));
  EXPECT_TRUE(torch::equal(read_idx(dir + "/a.gz", 100, &items), whole));
  EXPECT_EQ(items, 7);

  // Cut after the third item: its first three read, a fourth is missing.
  dtorch::testing::write_bytes(dir + "/cut", {bytes.begin(), bytes.end() - 4 * 5 * 4});
  EXPECT_TRUE(torch::equal(read_idx(dir + "/cut", 3), first));
  try {
    read_idx(dir + "/cut", 4);
    FAIL() << "no error reading 4 items of 3";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated: its header announces 7x5x4, of which the "
                                         "first 4 items take 80 data bytes but the file ends "
                                         "after 60 of them"),
              std::string::npos)
        << e.what();
  }
  auto extra = bytes;
  extra.push_back(1);
  dtorch::testing::write_bytes(dir + "/extra", extra);
  EXPECT_TRUE(torch::equal(read_idx(dir + "/extra", 3), first));
  expect_data_error(dir + "/extra", "has bytes after");
}

TEST(DataIdx, MissingFileNamesIt) {
  auto dir = dtorch::testing::scratch_dir("idx-missing");
  expect_data_error(dir + "/nope.gz", "no such file");
  expect_data_error(dir, "is a directory");
}

TEST(DataIdx, TruncatedRawAndGzippedFiles) {
  auto dir = dtorch::testing::scratch_dir("idx-trunc");
  auto bytes = idx_bytes({10, 28, 28}, pattern(10 * 28 * 28));
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 100);
  dtorch::testing::write_bytes(dir + "/cut", cut);
  expect_data_error(dir + "/cut", "truncated");
  // Cut inside the header's dimensions, and inside the magic number.
  dtorch::testing::write_bytes(dir + "/cut-header", {bytes.begin(), bytes.begin() + 9});
  expect_data_error(dir + "/cut-header", "truncated");
  dtorch::testing::write_bytes(dir + "/cut-magic", {0, 0});
  expect_data_error(dir + "/cut-magic", "truncated");
  // The gzip stream itself cut short: zlib reports it, or the data comes up short.
  dtorch::testing::write_gzip(dir + "/full.gz", bytes);
  auto gz = dtorch::testing::read_bytes(dir + "/full.gz");
  dtorch::testing::write_bytes(dir + "/cut.gz", {gz.begin(), gz.begin() + gz.size() / 2});
  EXPECT_THROW(read_idx(dir + "/cut.gz"), DataError);
  expect_data_error(dir + "/cut.gz", "cut.gz");
}

TEST(DataIdx, CorruptGzipIsDetected) {
  auto dir = dtorch::testing::scratch_dir("idx-corrupt-gz");
  dtorch::testing::write_gzip(dir + "/ok.gz", idx_bytes({50, 28, 28}, pattern(50 * 28 * 28)));
  auto gz = dtorch::testing::read_bytes(dir + "/ok.gz");
  // Flip bytes in the middle of the deflate stream; the gzip CRC catches what inflate does not.
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i)
    gz[i] ^= 0x5a;
  dtorch::testing::write_bytes(dir + "/bad.gz", gz);
  expect_data_error(dir + "/bad.gz", "bad.gz");
}

TEST(DataIdx, BadMagicUnsupportedTypeAndTrailingBytes) {
  auto dir = dtorch::testing::scratch_dir("idx-bad");
  dtorch::testing::write_bytes(dir + "/text", {'h', 'e', 'l', 'l', 'o', '\n'});
  expect_data_error(dir + "/text", "bad magic number");
  dtorch::testing::write_bytes(dir + "/float", idx_bytes({2}, pattern(8), 0x0D));
  expect_data_error(dir + "/float", "unsupported element type 0xd (float32)");
  auto extra = idx_bytes({4}, pattern(4));
  extra.push_back(1);
  dtorch::testing::write_bytes(dir + "/extra", extra);
  expect_data_error(dir + "/extra", "has bytes after");
}

TEST(DataIdx, ErrorsCarryDecimalFileAndLine) {
  // std::hex in one message must not leak into the file:line that follows it.
  auto dir = dtorch::testing::scratch_dir("idx-hex");
  dtorch::testing::write_bytes(dir + "/float", idx_bytes({2}, pattern(8), 0x0D));
  try {
    read_idx(dir + "/float");
    FAIL();
  } catch (const DataError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("idx.cpp:"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("idx.cpp:0x"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace dtorch::data
