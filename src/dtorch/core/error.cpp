// Formatting of the source location that DTORCH_CHECK appends to a message.
#include "dtorch/core/error.h"

#include <cstring>

namespace dtorch::detail {

std::string where(const char* file, int line) {
  // Paths below src/ are enough to find the line; the build directory's prefix is noise.
  const char* s = std::strstr(file, "src/dtorch/");
  return cat(s ? s + 4 : file, ":", line);
}

}  // namespace dtorch::detail
