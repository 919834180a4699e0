// Input files opened without blocking and judged by fstat (input_file.h, Note [Input files]).
#include "dtorch/core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtorch/core/paths.h"

namespace dtorch {

int open_input_file(const std::string& path, uint64_t max_bytes, uint64_t* size,
                    std::string* problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    *problem = errno == ENOENT ? "no such file" : str("cannot be opened: ", std::strerror(errno));
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *problem = str("cannot be examined: ", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    *problem = str("is ", paths::kind_of_mode(st.st_mode), ", not a file to read");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    *problem = str("is ", st.st_size, " bytes, more than the ", max_bytes, " this reader takes");
  } else {
    // Regular files never block: reads from here on may wait for the disk as usual.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *size = static_cast<uint64_t>(st.st_size);
    return fd;
  }
  ::close(fd);
  return -1;
}

std::string input_file_problem(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  std::string problem;
  const int fd = open_input_file(path, max_bytes, &size, &problem);
  if (fd >= 0) ::close(fd);
  return problem;
}

bool read_input_file(const std::string& path, uint64_t max_bytes, std::string* bytes,
                     std::string* problem) {
  uint64_t size = 0;
  bytes->clear();
  const int fd = open_input_file(path, max_bytes, &size, problem);
  if (fd < 0) return false;
  bytes->reserve(size);
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *problem = str("cannot be read: ", std::strerror(errno));
      break;
    }
    if (r == 0) {
      ::close(fd);
      return true;
    }
    // A file growing while it is read (a log, /proc) stops at the limit.
    if (bytes->size() + static_cast<uint64_t>(r) > max_bytes) {
      *problem = str("grew past the ", max_bytes, " bytes this reader takes while being read");
      break;
    }
    bytes->append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  bytes->clear();
  return false;
}

}  // namespace dtorch
