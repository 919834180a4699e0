// Tests for the JSONL metrics writer: record contents, one flushed line per record,
// append vs truncate, and the error for an unwritable path.
#include "dtorch/report/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::report {
namespace {

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line));
  return out;
}

EpochRecord record(int64_t epoch) {
  EpochRecord r;
  r.epoch = epoch;
  r.step = 40 * (epoch + 1);
  r.train_loss = 0.5;
  r.test_loss = 0.625;
  r.test_accuracy = 0.875;
  r.samples_per_s = 12345.5;
  r.seconds = 7.25;
  r.lr = 0.001;
  return r;
}

TEST(Metrics, EpochRecordFields) {
  EXPECT_EQ(epoch_record_json(record(3)),
            R"({"kind":"epoch","epoch":3,"step":160,"train_loss":0.5,"test_loss":0.625,)"
            R"("test_accuracy":0.875,"samples_per_s":12345.5,"seconds":7.25,"lr":0.001})");
  EpochRecord timed = record(0);
  timed.phase_ms = {{"forward", 1.5}, {"backward", 3.0}};
  auto t = nlohmann::json::parse(epoch_record_json(timed));
  EXPECT_EQ(t["forward_ms"], 1.5);
  EXPECT_EQ(t["backward_ms"], 3.0);
  EpochRecord r = record(0);
  r.train_loss = std::nan("");
  auto j = nlohmann::json::parse(epoch_record_json(r));
  EXPECT_TRUE(j["train_loss"].is_null());
  EXPECT_EQ(record_json("step", {{"step", 50}, {"lr", 0.5}, {"loss", std::nan("")}}),
            R"({"kind":"step","loss":null,"lr":0.5,"step":50})");
}

TEST(Metrics, WritesOneFlushedLinePerRecord) {
  auto dir = dtorch::testing::scratch_dir("metrics-lines");
  const std::string path = dir + "/sub/metrics.jsonl";
  {
    MetricsWriter w(path);
    w.write_epoch(record(0));
    // Flushed already: readable while the writer is still open.
    auto lines = read_lines(path);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["epoch"], 0);
    EXPECT_EQ(lines[0]["test_accuracy"], 0.875);
    w.write_epoch(record(1));
    w.write("step", {{"loss", 1.5}});
    EXPECT_THROW(w.write_line("{\n}"), Error);
  }
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["epoch"], 1);
  EXPECT_EQ(lines[2]["kind"], "step");
  {
    MetricsWriter again(path);  // appends
    again.write_epoch(record(2));
  }
  EXPECT_EQ(read_lines(path).size(), 4u);
  {
    MetricsWriter fresh(path, /*append=*/false);
    fresh.write_epoch(record(0));
  }
  EXPECT_EQ(read_lines(path).size(), 1u);
}

TEST(Metrics, UnwritablePathIsConfigError) {
  auto dir = dtorch::testing::scratch_dir("metrics-bad");
  std::ofstream(dir + "/file") << "x";
  try {
    MetricsWriter w(dir + "/file/metrics.jsonl");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/file/metrics.jsonl"), std::string::npos);
  }
}

}  // namespace
}  // namespace dtorch::report
