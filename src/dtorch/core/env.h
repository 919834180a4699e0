// Typed reads of environment variables, with errors that name the variable and its value.
#pragma once

#include <optional>
#include <string>

namespace dtorch::env {

/// The variable's value, or nullopt when unset or empty.
std::optional<std::string> get(const char* name);
/// The variable as an integer; throws ConfigError naming it when set but not an integer.
std::optional<long> get_int(const char* name);
/// The variable as a number of seconds (integer or decimal), same errors as get_int.
std::optional<double> get_seconds(const char* name);

}  // namespace dtorch::env
