// Tests for byte-level text data: file and folder loading, the fortunes corpus, the
// train/validation split, windows and batches, and the errors for unusable inputs.
#include "dtorch/data/text_dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/data/sampler.h"
#include "models/interop.h"
#include "support/error_of.h"

namespace dtorch::data {
namespace {

std::string write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string as_string(const torch::Tensor& ids) {
  std::string s;
  for (int64_t i = 0; i < ids.numel(); ++i)
    s += static_cast<char>(ids[i].item<int64_t>());
  return s;
}

TEST(DataText, FileBytesBecomeIds) {
  dtorch::testing::TempDir tmp("text-file");
  const std::string& dir = tmp.path();
  const std::string bytes = std::string("h\xc3\xa9llo\n\x00\xff", 9);
  auto t = load_text(write(dir + "/a.txt", bytes));
  EXPECT_EQ(t.tokens.scalar_type(), torch::kLong);
  ASSERT_EQ(t.size(), 9);
  EXPECT_EQ(t.tokens[1].item<int64_t>(), 0xc3);
  EXPECT_EQ(t.tokens[7].item<int64_t>(), 0);
  EXPECT_EQ(t.tokens[8].item<int64_t>(), 255);
  EXPECT_EQ(as_string(t.tokens), bytes);
}

TEST(DataText, FolderConcatenatesTextFilesInNameOrder) {
  dtorch::testing::TempDir tmp("text-folder");
  const std::string& dir = tmp.path();
  write(dir + "/b", "BB");
  write(dir + "/a", "AA");
  write(dir + "/a.dat", "index");
  write(dir + "/.hidden", "no");
  paths::create_symlink("a", dir + "/a.u8");
  paths::create_directory(dir + "/sub");
  EXPECT_EQ(as_string(load_text(dir).tokens), "AABB");
}

TEST(DataText, DefaultCorpusIsFortunes) {
  if (!paths::exists(std::string(kDefaultTextDir) + "/fortunes"))
    GTEST_SKIP() << "no fortunes corpus (apt-get install fortunes)";
  auto t = load_text("");
  EXPECT_EQ(t.source, kDefaultTextDir);
  EXPECT_GT(t.size(), 1000000);  // about 2.6 MB
  EXPECT_GE(t.tokens.min().item<int64_t>(), 0);
  EXPECT_LE(t.tokens.max().item<int64_t>(), 255);
  // Text, not index files: mostly printable ASCII, with '%' separating fortunes.
  auto printable = ((t.tokens >= 32) & (t.tokens < 127)) | (t.tokens == '\n') | (t.tokens == '\t');
  EXPECT_GT(printable.to(torch::kDouble).mean().item<double>(), 0.98);
  EXPECT_NE(as_string(t.tokens.slice(0, 0, 200000)).find("\n%\n"), std::string::npos);
}

TEST(DataText, ErrorsNameThePathAndTheFix) {
  dtorch::testing::TempDir tmp("text-errors");
  const std::string& dir = tmp.path();
  std::string e = testing::error_of<DataError>([&] { load_text(dir + "/missing.txt"); });
  EXPECT_NE(e.find("missing.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  e = testing::error_of<DataError>([&] { load_text(write(dir + "/empty.txt", "")); });
  EXPECT_NE(e.find("empty.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  paths::create_directory(dir + "/nothing");
  write(dir + "/nothing/x.dat", "idx");
  e = testing::error_of<DataError>([&] { load_text(dir + "/nothing"); });
  EXPECT_NE(e.find("holds no text files"), std::string::npos) << e;
  if (!paths::exists(kDefaultTextDir)) {
    e = testing::error_of<DataError>([&] { load_text(""); });
    EXPECT_NE(e.find("apt-get install fortunes"), std::string::npos) << e;
  }
  TextData short_text = load_text(write(dir + "/short.txt", "abcd"));
  EXPECT_EQ(num_windows(short_text, 3), 1);
  e = testing::error_of<DataError>([&] { num_windows(short_text, 4); });
  EXPECT_NE(e.find("short.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("shorter sequence"), std::string::npos) << e;
  EXPECT_THROW(num_windows(short_text, 0), ConfigError);
  EXPECT_THROW(text_batch(short_text, {1}, 3), DataError);
  EXPECT_THROW(text_batch(short_text, {-1}, 3), DataError);
}

TEST(DataText, SplitKeepsTheLastTenthForValidation) {
  TextData t{torch::arange(1000, torch::kLong), "t"};
  auto s = split_text(t);
  EXPECT_EQ(s.train.size(), 900);
  EXPECT_EQ(s.val.size(), 100);
  EXPECT_EQ(s.train.tokens[899].item<int64_t>(), 899);
  EXPECT_EQ(s.val.tokens[0].item<int64_t>(), 900);
  EXPECT_EQ(split_text(t, 0.0).val.size(), 0);
  EXPECT_THROW(split_text(t, 1.0), ConfigError);
}

TEST(DataText, WindowsAndBatches) {
  // tokens 0..100: windows of 10 inputs start at 0, 10, ..., 90; the last needs token 100.
  TextData t{torch::arange(101, torch::kLong), "t"};
  EXPECT_EQ(num_windows(t, 10), 10);
  EXPECT_EQ(num_windows(TextData{torch::arange(100, torch::kLong), "t"}, 10), 9);
  auto [x, y] = text_batch(t, {9, 0, 9}, 10);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{3, 10}));
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(x.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(x[0], torch::arange(90, 100, torch::kLong)));
  EXPECT_TRUE(torch::equal(y[0], torch::arange(91, 101, torch::kLong)));
  EXPECT_TRUE(torch::equal(x[1], torch::arange(0, 10, torch::kLong)));
  EXPECT_TRUE(torch::equal(x[2], x[0]));

  // One epoch over a DistributedSampler's indices: each token after the first is a target
  // exactly once across two ranks (the padded repeat aside).
  std::multiset<int64_t> targets;
  for (int rank = 0; rank < 2; ++rank) {
    DistributedSampler sampler(num_windows(t, 10), rank, 2, /*seed=*/3);
    for (const auto& b : make_batches(sampler.indices(), 4)) {
      auto batch = text_batch(t, b, 10);
      for (int64_t i = 0; i < batch.targets.numel(); ++i)
        targets.insert(batch.targets.flatten()[i].item<int64_t>());
    }
  }
  EXPECT_EQ(std::set<int64_t>(targets.begin(), targets.end()).size(), 100u);
  EXPECT_EQ(targets.count(0), 0u);
  EXPECT_EQ(targets.size(), 100u);
}

}  // namespace
}  // namespace dtorch::data
