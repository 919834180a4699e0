// Logging implementation: one line per call, written with a single fwrite so lines from
// threads do not interleave mid-line.
#include "dtorch/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dtorch::log {
namespace {

std::atomic<int> g_rank{-1};

Level level_from_env() {
  const char* v = std::getenv("DTORCH_LOG_LEVEL");
  if (!v) return Level::Info;
  if (!std::strcmp(v, "debug")) return Level::Debug;
  if (!std::strcmp(v, "warn")) return Level::Warn;
  if (!std::strcmp(v, "error")) return Level::Error;
  return Level::Info;
}

const char* name(Level l) {
  switch (l) {
    case Level::Debug:
      return "debug";
    case Level::Info:
      return "info";
    case Level::Warn:
      return "warning";
    case Level::Error:
      return "error";
  }
  return "";
}

}  // namespace

void set_rank(int rank) {
  // Under `dtorch launch` each line already carries the rank (DTORCH_OUTPUT_PREFIXED).
  static const bool prefixed = std::getenv("DTORCH_OUTPUT_PREFIXED") != nullptr;
  g_rank = prefixed ? -1 : rank;
}

bool enabled(Level level) {
  static const Level min_level = level_from_env();
  return level >= min_level;
}

void write(Level level, const std::string& msg) {
  std::string line = "dtorch";
  if (g_rank >= 0) line += str("[rank ", g_rank.load(), "]");
  // Lines are for users: a caught error's source location is noise there (debug lines keep it).
  line += str(" ", name(level), ": ", level == Level::Debug ? msg : without_locations(msg), "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace dtorch::log
