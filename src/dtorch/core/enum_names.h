// The names users write for the values of a closed set (a strategy, a precision, a pipeline
// schedule), kept beside its enum and read by flags, config.json, DeepSpeed files and messages.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtorch {

// Note [Closed sets]
// A setting with a fixed set of values is an enum, never a string compared wherever it is used.
// Beside each such enum, in its namespace, `const NameTable<E>& names(E)` lists its values with
// the one name each has in flags, JSON and messages (the first entry is the default's); the
// helpers below find that table by argument-dependent lookup, so a new value is one line there.
template <class E>
using NameTable = std::vector<std::pair<E, std::string>>;

/// The name of `e` ("zero3").
template <class E>
const std::string& name_of(E e) {
  const auto& table = names(E{});
  for (const auto& n : table)
    if (n.first == e) return n.second;
  return table.front().second;
}

/// The value called `name`, or nullopt.
template <class E>
std::optional<E> value_named(const std::string& name) {
  for (const auto& n : names(E{}))
    if (n.second == name) return n.first;
  return std::nullopt;
}

/// Every name, in the table's order ("ddp", "zero1", ...).
template <class E>
std::vector<std::string> names_of() {
  std::vector<std::string> v;
  for (const auto& n : names(E{}))
    v.push_back(n.second);
  return v;
}

/// "a, b or c": the names, for a message that lists them.
template <class E>
std::string listed() {
  const auto v = names_of<E>();
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i)
    s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

}  // namespace dtorch
