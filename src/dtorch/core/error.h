// dtorch's errors: one exception hierarchy, and DTORCH_CHECK to throw it with file:line.
// Library code never exits; main() turns these into exit codes and one clear message.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtorch {

/// Base of every error dtorch throws. what() is the message a user reads; it names the
/// problem and, where there is one, the fix.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Bad flags, options or environment.
class ConfigError : public Error {
  using Error::Error;
};
/// Unreadable or malformed input data.
class DataError : public Error {
  using Error::Error;
};
/// A collective or rendezvous failed: a peer died, stalled, or disagreed.
class CommError : public Error {
  using Error::Error;
};
/// A checkpoint could not be written or read.
class CheckpointError : public Error {
  using Error::Error;
};
/// Training cannot go on: the loss diverged to NaN or infinity.
class TrainingError : public Error {
  using Error::Error;
};
/// An allocation failed: the message says which rank, what it held, and what would fit.
class OutOfMemoryError : public Error {
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
std::string where(const char* file, int line);
}  // namespace detail

/// Concatenates its arguments with operator<< into a string.
template <typename... Args>
std::string str(Args&&... args) {
  return detail::cat(std::forward<Args>(args)...);
}

/// `text` without the source locations DTORCH_CHECK appends (" [src/dtorch/x.cpp:12]"), wherever
/// they stand: the words a user reads when an error's message becomes part of a warning or of
/// another message. A location helps only with dtorch's own bugs (tools/main.cpp keeps it for
/// a plain dtorch::Error).
std::string without_locations(const std::string& text);

/// The first line of `text`: an exception's message without the backtrace LibTorch's errors
/// carry on the lines after it.
std::string first_line(const std::string& text);

/// "a, b, c": the choices a message lists.
std::string joined(const std::vector<std::string>& words, const std::string& separator = ", ");

}  // namespace dtorch

/// Throws ErrorType with the message and file:line when cond is false.
#define DTORCH_CHECK_T(ErrorType, cond, ...)                                                    \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      throw ErrorType(::dtorch::detail::cat(__VA_ARGS__, " [",                                  \
                                            ::dtorch::detail::where(__FILE__, __LINE__), "]")); \
    }                                                                                           \
  } while (0)

/// Throws dtorch::Error with the message and file:line when cond is false.
#define DTORCH_CHECK(cond, ...) DTORCH_CHECK_T(::dtorch::Error, cond, __VA_ARGS__)

/// Throws ErrorType unconditionally.
#define DTORCH_FAIL(ErrorType, ...) DTORCH_CHECK_T(ErrorType, false, __VA_ARGS__)
