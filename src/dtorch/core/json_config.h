// Configuration files in JSON, read key by key: syntax errors and duplicate keys name their
// line and column, every key is checked against the ones the format knows (a misspelt key is an
// error naming the nearest known one, a known key the program ignores is a warning), and the
// getters check each value's type and range, naming the key's path in the message.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtorch::json_config {

using Keys = std::vector<std::string>;

/// The word of `known` a user most likely meant by `word`: one that holds it with letters left
/// out ("warmup_steps" in "warmup_num_steps"), else the fewest edits away.
std::string nearest(const std::string& word, const Keys& known);

/// The deepest nesting of objects and arrays a JSON file dtorch reads may have. Code that walks
/// a JSON value (dump, comparison, conversion) recurses once per level, so a file nested
/// 100000 deep would overflow the stack; real files nest fewer than ten.
constexpr int kMaxDepth = 64;

/// Parses `text` (`name`, the file, starts every message). ConfigError "NAME:LINE:COLUMN: not
/// valid JSON (...)" for bad syntax, pointing out a comma before '}' or ']', for a key given
/// twice in one object, for nesting deeper than kMaxDepth and for a number beyond a double's
/// range.
nlohmann::json parse(const std::string& text, const std::string& name);
/// As parse, for JSON whose faults the caller reports in its own words (a checkpoint's
/// metadata): false with `why` set to parse's message without the name.
bool try_parse(const std::string& text, nlohmann::json* out, std::string* why);

/// `v` as a whole number of type T (an integer, or a float with no fraction, within T's range),
/// checked before it is converted: nlohmann's get<T>() casts a float such as 1e30 to an integer
/// unchecked, which is undefined behaviour. Throws std::out_of_range "WHAT must be a whole number
/// from LO to HI (got V)" for anything else, for a caller that wraps what it reads in its own
/// message (a checkpoint's "is malformed (...)").
template <typename T>
T whole_number(const nlohmann::json& v, const std::string& what) {
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  bool ok = false;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else if (v.is_number_integer()) {
    const int64_t n = v.get<int64_t>();
    ok = (std::numeric_limits<T>::is_signed || n >= 0) && static_cast<double>(n) >= lo &&
         static_cast<double>(n) <= hi;
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    // For a 64-bit T, hi is its max rounded up to 2^63 or 2^64: stay below it.
    ok = std::trunc(d) == d && d >= lo && (sizeof(T) < 8 ? d <= hi : d < hi);
  }
  if (!ok)
    throw std::out_of_range(
        what + " must be a whole number from " + std::to_string(std::numeric_limits<T>::min()) +
        " to " + std::to_string(std::numeric_limits<T>::max()) + " (got " + v.dump() + ")");
  return v.is_number_float() ? static_cast<T>(v.get<double>()) : v.get<T>();
}

/// What a JSON library or conversion error says, without nlohmann's
/// "[json.exception.type_error.302] " prefix and dtorch's source locations: "type must be number,
/// but is string".
std::string reason(const std::exception& e);

/// One JSON object of a file. A value null counts as absent, and so does "auto" (Hugging Face's
/// placeholder for "let the program decide") unless `auto_is_absent` is false (a format whose
/// values include "auto"). Refers to the JSON and the warnings, which must outlive it.
class Section {
 public:
  /// ConfigError unless `j` is an object. `path` is its dotted key ("" for the top level). Its
  /// sections inherit `auto_is_absent`.
  Section(const nlohmann::json& j, std::string path, std::string file,
          std::vector<std::string>* warnings, bool auto_is_absent = true);

  /// Checks every key: `read` are the keys the caller reads, `ignored` those the format has
  /// and the program does not implement (a warning each); any other is a ConfigError naming
  /// the nearest known key.
  void keys(const Keys& read, const Keys& ignored) const;
  /// Adds the warning "FILE: PATH.KEY is ignored: WHY".
  void ignore(const std::string& key, const std::string& why) const;

  /// The value of `key`; nullptr when absent, null or "auto".
  const nlohmann::json* get(const std::string& key) const;
  bool has(const std::string& key) const { return get(key) != nullptr; }
  /// A whole number in [lo, hi] (1.0 counts as whole).
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const;
  /// A number in [lo, hi]; above lo when `open_low`.
  std::optional<double> number(const std::string& key, double lo, double hi,
                               bool open_low = false) const;
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> text(const std::string& key) const;
  /// A string among `choices` (compared in lower case when `any_case`); returned as the choice
  /// is spelt. Another string is a ConfigError listing the choices and the nearest one.
  std::optional<std::string> choice(const std::string& key, const Keys& choices,
                                    bool any_case = false) const;
  /// The object under `key`.
  std::optional<Section> section(const std::string& key) const;
  /// An empty object standing for an absent `key`, so that its defaults read the same way.
  Section empty_section(const std::string& key) const;

  const nlohmann::json& value() const { return j_; }
  /// "PATH.KEY" (or "KEY" at the top level).
  std::string name(const std::string& key) const;
  const std::string& file() const { return file_; }

 private:
  std::string where() const;

  const nlohmann::json& j_;
  std::string path_;
  std::string file_;
  std::vector<std::string>* warnings_;
  bool auto_is_absent_;
};

}  // namespace dtorch::json_config
