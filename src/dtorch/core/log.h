// Logging to stderr with the rank in front, so interleaved output from many ranks reads.
// Level from DTORCH_LOG_LEVEL (debug|info|warn|error, default info).
#pragma once

#include <string>

#include "dtorch/core/error.h"

namespace dtorch::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

/// Sets the rank shown in front of each line (-1: none). Called once the rank is known.
void set_rank(int rank);
bool enabled(Level level);
void write(Level level, const std::string& msg);

template <typename... Args>
void debug(Args&&... a) {
  if (enabled(Level::Debug)) write(Level::Debug, str(std::forward<Args>(a)...));
}
template <typename... Args>
void info(Args&&... a) {
  if (enabled(Level::Info)) write(Level::Info, str(std::forward<Args>(a)...));
}
template <typename... Args>
void warn(Args&&... a) {
  if (enabled(Level::Warn)) write(Level::Warn, str(std::forward<Args>(a)...));
}
template <typename... Args>
void error(Args&&... a) {
  if (enabled(Level::Error)) write(Level::Error, str(std::forward<Args>(a)...));
}

}  // namespace dtorch::log
