// Configuration files in JSON, read key by key: syntax errors and duplicate keys name their
// line and column, every key is checked against the ones the format knows (a misspelt key is an
// error naming the nearest known one, a known key the program ignores is a warning), and the
// getters check each value's type and range, naming the key's path in the message.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtorch::json_config {

using Keys = std::vector<std::string>;

/// The word of `known` a user most likely meant by `word`: one that holds it with letters left
/// out ("warmup_steps" in "warmup_num_steps"), else the fewest edits away.
std::string nearest(const std::string& word, const Keys& known);

/// Parses `text` (`name`, the file, starts every message). ConfigError "NAME:LINE:COLUMN: not
/// valid JSON (...)" for bad syntax, pointing out a comma before '}' or ']', and for a key
/// given twice in one object.
nlohmann::json parse(const std::string& text, const std::string& name);

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
