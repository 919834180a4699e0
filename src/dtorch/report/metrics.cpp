// JSONL metrics: nlohmann::json builds each line, so strings are escaped and numbers are
// written with full precision; each line is flushed so nothing sits in a buffer at a crash.
#include "dtorch/report/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtorch/core/atomic_file.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::report {
namespace {

// nlohmann would print NaN as null anyway; saying so here keeps it explicit.
nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}

// A count (a step, a byte total) arrives as a double; readers want 50, not 50.0.
nlohmann::json count_or_number(double v) {
  const bool whole = std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 0x1p53;
  return whole ? nlohmann::json(static_cast<int64_t>(v)) : number(v);
}

}  // namespace

std::string epoch_record_json(const EpochRecord& r) {
  // ordered_json keeps the documented field order, which reads better in a terminal.
  nlohmann::ordered_json j;
  j["kind"] = "epoch";
  j["epoch"] = r.epoch;
  j["step"] = r.step;
  j["train_loss"] = number(r.train_loss);
  j["test_loss"] = number(r.test_loss);
  j["test_accuracy"] = number(r.test_accuracy);
  j["samples_per_s"] = number(r.samples_per_s);
  j["seconds"] = number(r.seconds);
  j["lr"] = number(r.lr);
  for (const auto& [phase, ms] : r.phase_ms)
    j[phase + "_ms"] = number(ms);
  for (const auto& [key, value] : r.more)
    j[key] = count_or_number(value);
  return j.dump();
}

std::string record_json(const std::string& kind, const std::map<std::string, double>& numbers) {
  nlohmann::ordered_json j;
  j["kind"] = kind;
  for (const auto& [key, value] : numbers) {
    j[key] = count_or_number(value);
  }
  return j.dump();
}

void keep_records_through(const std::string& path, int64_t step) {
  if (!paths::is_regular_file(path)) return;
  std::ifstream in(path, std::ios::binary);
  DTORCH_CHECK_T(ConfigError, in.good(), "cannot read metrics file ", path, ": ",
                 std::strerror(errno));
  std::string kept;
  bool dropped = false;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool later = j.is_object() && j.contains("step") && j["step"].is_number() &&
                       j["step"].get<double>() > static_cast<double>(step);
    if (!j.is_object() || later) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  DTORCH_CHECK_T(ConfigError, in.eof(), "cannot read metrics file ", path, ": ",
                 std::strerror(errno));
  if (!dropped) return;
  if (auto failed = write_file_atomically(path, kept.data(), kept.size()))
    DTORCH_FAIL(ConfigError, *failed);
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  const std::string parent = paths::parent_path(path);
  std::error_code ec;
  if (!parent.empty()) paths::create_directories(parent, ec);
  // Opening a FIFO to write would block until a reader comes; a device would take the lines.
  const std::string kind = paths::kind(path);
  DTORCH_CHECK_T(ConfigError, kind.empty() || kind == "a regular file", "metrics file ", path,
                 " is ", kind, ", not a file; move it away or train into another --out");
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  DTORCH_CHECK_T(ConfigError, f_ != nullptr, "cannot open metrics file ", path, ": ",
                 std::strerror(errno),
                 " (train into a writable directory: `dtorch train --out DIR`)");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write_epoch(const EpochRecord& r) {
  write_line(epoch_record_json(r));
}

void MetricsWriter::write(const std::string& kind, const std::map<std::string, double>& numbers) {
  write_line(record_json(kind, numbers));
}

void MetricsWriter::write_line(const std::string& json) {
  DTORCH_CHECK(json.find('\n') == std::string::npos,
               "metrics record spans several lines; JSONL needs one object per line");
  std::string line = json + "\n";
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0;
  DTORCH_CHECK_T(ConfigError, ok, "cannot write metrics file ", path_, ": ", std::strerror(errno),
                 " (disk full?)");
}

}  // namespace dtorch::report
