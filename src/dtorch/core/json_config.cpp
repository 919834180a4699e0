// Configuration files in JSON, read key by key (json_config.h).
#include "dtorch/core/json_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "dtorch/core/error.h"

namespace dtorch::json_config {
namespace {

using json = nlohmann::json;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Whether the characters of `part` appear in `whole` in order ("warmup_steps" in
// "warmup_num_steps"): a key with words left out.
bool is_subsequence(const std::string& part, const std::string& whole) {
  size_t at = 0;
  for (char ch : whole)
    if (at < part.size() && part[at] == ch) ++at;
  return at == part.size();
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

// Line and column (1-based) of byte offset `at` in `text`.
std::pair<int, int> line_column(const std::string& text, size_t at) {
  int line = 1, column = 1;
  for (size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

// "from 0 to 3", or ">= 1" for no upper bound.
std::string range(double lo, double hi) {
  if (hi >= static_cast<double>(std::numeric_limits<int64_t>::max())) return str(">= ", lo);
  return str("from ", lo, " to ", hi);
}

}  // namespace

std::string nearest(const std::string& key, const Keys& known) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const bool holding : {true, false}) {
    for (const auto& k : known) {
      if (holding && !is_subsequence(key, k)) continue;
      const size_t d = edit_distance(key, k);
      if (d < best_distance) best_distance = d, best = k;
    }
    if (!best.empty()) return best;
  }
  return best;
}

nlohmann::json parse(const std::string& text, const std::string& name) {
  std::vector<std::vector<std::string>> open;  // the keys seen in each open object
  std::optional<std::string> duplicate;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    const bool opens =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    // Thrown from inside the parser, so nothing deeper is ever built (Note [Input files]).
    DTORCH_CHECK_T(ConfigError, !opens || depth < kMaxDepth, name,
                   ": nests objects and arrays more than ", kMaxDepth,
                   " deep; no file dtorch reads has more than a few levels");
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == json::parse_event_t::key && !open.empty() && !duplicate) {
      const std::string key = parsed.get<std::string>();
      auto& seen = open.back();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) duplicate = key;
      seen.push_back(key);
    }
    return true;
  };
  // nlohmann's parser takes a NUL byte for the end of the input: what follows would be lost.
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    auto [line, column] = line_column(text, nul);
    DTORCH_FAIL(ConfigError, name, ":", line, ":", column, ": a NUL byte at offset ", nul,
                ": a JSON file is text; restore the file, or write it again");
  }
  try {
    json j = json::parse(text, check);
    DTORCH_CHECK_T(ConfigError, !duplicate, name, ": the key '", duplicate.value_or(""),
                   "' appears twice in one object (JSON readers disagree on which one wins); keep "
                   "one");
    return j;
  } catch (const json::parse_error& e) {
    const size_t at = e.byte > 0 ? e.byte - 1 : 0;
    auto [line, column] = line_column(text, at);
    std::string what = e.what();
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    std::string hint;
    size_t back = std::min(at, text.size());
    while (back > 0 && std::isspace(static_cast<unsigned char>(text[back - 1])))
      --back;
    const size_t next = text.find_first_not_of(" \t\r\n", at);
    if (back > 0 && text[back - 1] == ',' && next != std::string::npos &&
        (text[next] == '}' || text[next] == ']')) {
      auto [comma_line, comma_column] = line_column(text, back - 1);
      hint = str("; JSON allows no comma before '", text[next], "': remove the ',' at line ",
                 comma_line, ", column ", comma_column);
    }
    DTORCH_FAIL(ConfigError, name, ":", line, ":", column, ": not valid JSON (", what, ")", hint);
  } catch (const json::out_of_range& e) {
    // The one such error parsing raises: a number beyond a double's range (1e400).
    DTORCH_FAIL(ConfigError, name, ": not valid JSON (", reason(e),
                "): numbers must lie within +-1.8e308");
  }
}

bool try_parse(const std::string& text, nlohmann::json* out, std::string* why) {
  try {
    *out = parse(text, "");
    return true;
  } catch (const ConfigError& e) {
    // Drops the empty name and its ": " or ":" (line and column stay).
    const std::string m = without_locations(e.what());
    *why = m.rfind(": ", 0) == 0 ? m.substr(2) : m.rfind(":", 0) == 0 ? m.substr(1) : m;
    return false;
  }
}

std::string reason(const std::exception& e) {
  std::string what = without_locations(e.what());
  if (what.rfind("[json.exception.", 0) == 0)
    if (const auto end = what.find("] "); end != std::string::npos) what = what.substr(end + 2);
  return what;
}

Section::Section(const json& j, std::string path, std::string file,
                 std::vector<std::string>* warnings, bool auto_is_absent)
    : j_(j),
      path_(std::move(path)),
      file_(std::move(file)),
      warnings_(warnings),
      auto_is_absent_(auto_is_absent) {
  DTORCH_CHECK_T(ConfigError, j.is_object(), file_, ": ", where(), " must be an object {...} (got ",
                 j.dump(), ")");
}

void Section::keys(const Keys& read, const Keys& ignored) const {
  Keys known = read;
  known.insert(known.end(), ignored.begin(), ignored.end());
  for (const auto& [key, value] : j_.items()) {
    if (std::find(read.begin(), read.end(), key) != read.end()) continue;
    DTORCH_CHECK_T(ConfigError, std::find(ignored.begin(), ignored.end(), key) != ignored.end(),
                   file_, ": unknown key '", key, "' in ", where(), "; did you mean '",
                   nearest(key, known), "'?");
    ignore(key, "dtorch does not implement it");
  }
}

void Section::ignore(const std::string& key, const std::string& why) const {
  warnings_->push_back(str(file_, ": ", name(key), " is ignored: ", why));
}

const json* Section::get(const std::string& key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return nullptr;
  if (auto_is_absent_ && it->is_string() && *it == "auto") return nullptr;
  return &*it;
}

std::optional<int64_t> Section::integer(const std::string& key, int64_t lo, int64_t hi) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  std::optional<int64_t> got;  // converted only when it fits (1e308 is no int64)
  try {
    got = whole_number<int64_t>(*v, name(key));
  } catch (const std::out_of_range&) {
  }
  DTORCH_CHECK_T(ConfigError, got && *got >= lo && *got <= hi, file_, ": ", name(key),
                 " must be a whole number ",
                 range(static_cast<double>(lo), static_cast<double>(hi)), " (got ", v->dump(), ")");
  return *got;
}

std::optional<double> Section::number(const std::string& key, double lo, double hi,
                                      bool open_low) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  const double got = v->is_number() ? v->get<double>() : 0;
  DTORCH_CHECK_T(ConfigError, v->is_number() && (open_low ? got > lo : got >= lo) && got <= hi,
                 file_, ": ", name(key), " must be a number ",
                 open_low && lo == 0 ? "above 0" : range(lo, hi), " (got ", v->dump(), ")");
  return got;
}

std::optional<bool> Section::boolean(const std::string& key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  DTORCH_CHECK_T(ConfigError, v->is_boolean(), file_, ": ", name(key),
                 " must be true or false (got ", v->dump(), ")");
  return v->get<bool>();
}

std::optional<std::string> Section::text(const std::string& key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  DTORCH_CHECK_T(ConfigError, v->is_string(), file_, ": ", name(key), " must be a string (got ",
                 v->dump(), ")");
  return v->get<std::string>();
}

std::optional<std::string> Section::choice(const std::string& key, const Keys& choices,
                                           bool any_case) const {
  const auto got = text(key);
  if (!got) return std::nullopt;
  for (const auto& c : choices)
    if (*got == c || (any_case && lowercase(*got) == lowercase(c))) return c;
  std::string list;
  for (const auto& c : choices)
    list += (list.empty() ? "" : ", ") + c;
  DTORCH_FAIL(ConfigError, file_, ": ", name(key), " '", *got, "' is not one of ", list,
              "; did you mean '", nearest(*got, choices), "'?");
}

std::optional<Section> Section::section(const std::string& key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  return Section(*v, name(key), file_, warnings_, auto_is_absent_);
}

Section Section::empty_section(const std::string& key) const {
  static const json empty = json::object();
  return Section(empty, name(key), file_, warnings_, auto_is_absent_);
}

std::string Section::name(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::string Section::where() const {
  return path_.empty() ? "the top level" : path_;
}

}  // namespace dtorch::json_config
