// Test helper: the message of the error a call throws, for tests of what an error says.
#pragma once

#include <string>

#include "dtorch/core/error.h"

namespace dtorch::testing {

/// What `f()` throws as ErrorType (dtorch's ConfigError unless named), or "(no error)" when it
/// returns; another exception passes through and fails the test.
template <typename ErrorType = ConfigError, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ErrorType& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace dtorch::testing
