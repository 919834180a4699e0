// Typed environment reads: a malformed value is a ConfigError, never a silent default.
#include "dtorch/core/env.h"

#include <cstdlib>

#include "dtorch/core/error.h"

namespace dtorch::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<long> get_int(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  DTORCH_CHECK_T(ConfigError, end && *end == '\0', "environment variable ", name, "='", *v,
                 "' is not an integer; unset it or give a whole number");
  return x;
}

std::optional<double> get_seconds(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  DTORCH_CHECK_T(ConfigError, end && *end == '\0' && x > 0, "environment variable ", name, "='", *v,
                 "' is not a positive number of seconds");
  return x;
}

}  // namespace dtorch::env
