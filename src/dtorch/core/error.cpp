// Formatting of the source location that DTORCH_CHECK appends to a message.
#include "dtorch/core/error.h"

#include <regex>
#include <string>

namespace dtorch::detail {

std::string where(const char* file, int line) {
  // Relative to the repository (src/dtorch/..., tools/...): the build machine's prefix is
  // noise to a user. The rightmost top-level folder wins, wherever the clone lives.
  const std::string path = file;
  size_t from = 0;
  for (const char* top : {"/src/dtorch/", "/tools/", "/tests/", "/examples/"}) {
    const size_t at = path.rfind(top);
    if (at != std::string::npos && (from == 0 || at + 1 > from)) from = at + 1;
  }
  return cat(path.substr(from), ":", line);
}

}  // namespace dtorch::detail

namespace dtorch {

std::string without_locations(const std::string& text) {
  static const std::regex where(
      R"( \[(src/dtorch|tools|tests|examples)/[A-Za-z0-9_./-]+:[0-9]+\])");
  return std::regex_replace(text, where, "");
}

std::string first_line(const std::string& text) {
  auto p = text.find('\n');
  return p == std::string::npos ? text : text.substr(0, p);
}

std::string joined(const std::vector<std::string>& words, const std::string& separator) {
  std::string s;
  for (const auto& w : words)
    s += (s.empty() ? "" : separator) + w;
  return s;
}

}  // namespace dtorch
