// Whole numbers as users and files write them: base 10, all of the text, within int64.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace dtorch {

/// `text` as a whole number: digits with an optional '-', nothing before or after, within
/// int64; nullopt for anything else ("", " 1", "1e3", "12x", 2^63).
inline std::optional<int64_t> parse_whole_number(const std::string& text) {
  if (text.empty() || !(text[0] == '-' || (text[0] >= '0' && text[0] <= '9'))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return static_cast<int64_t>(n);
}

}  // namespace dtorch
