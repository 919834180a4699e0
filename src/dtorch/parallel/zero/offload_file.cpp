// The offload folder's files (offload_file.h).
#include "dtorch/parallel/zero/offload_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::zero {
namespace offload_file {

size_t page_bytes() {
  static const size_t bytes = std::max<size_t>(4096, static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  return bytes;
}

size_t aligned(size_t n) {
  return (n + page_bytes() - 1) / page_bytes() * page_bytes();
}

std::string gib(uint64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << bytes / double(uint64_t{1} << 30) << " GiB";
  return os.str();
}

Made make(const std::string& dir, const std::string& name, size_t bytes, bool direct,
          const std::string& what) {
  DTORCH_CHECK_T(ConfigError, paths::is_directory(dir), "the offload folder ", dir,
                 " does not exist (--offload-dir, or ds_config's nvme_path): create it on a fast ",
                 "local disk, or name another");
  Made m;
  m.path = paths::join(dir, name);
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) m.fd = ::open(m.path.c_str(), flags | O_DIRECT, 0600);
  if (!direct || (m.fd < 0 && errno == EINVAL)) m.fd = ::open(m.path.c_str(), flags, 0600);
  DTORCH_CHECK_T(ConfigError, m.fd >= 0, "cannot make the offload file ", m.path, " for ", what,
                 ": ", std::strerror(errno),
                 "; give --offload-dir a folder this user may write to");
  ::unlink(m.path.c_str());  // it goes when the run does
  struct statvfs fs {};
  const uint64_t available =
      ::statvfs(dir.c_str(), &fs) == 0 ? uint64_t{fs.f_bavail} * fs.f_frsize : 0;
  // fallocate, not posix_fallocate: where the filesystem cannot reserve space, glibc's
  // emulation would write the whole file, and fill the disk before it failed.
  int err = 0;
  if (bytes && ::fallocate(m.fd, 0, 0, static_cast<off_t>(bytes)) != 0) err = errno;
  if (err == EOPNOTSUPP) {
    err = available >= bytes ? 0 : ENOSPC;  // the free space now, then
    if (err == 0 && ::ftruncate(m.fd, static_cast<off_t>(bytes)) != 0) err = errno;
  }
  if (err == 0) return m;
  ::close(m.fd);
  DTORCH_CHECK_T(ConfigError, err != ENOSPC && err != EFBIG, "the offload folder ", dir, " has ",
                 available, " bytes (", gib(available), ") free, and ", what, " needs ", bytes,
                 " (", gib(bytes), "): free space there, or give --offload-dir a larger disk");
  DTORCH_FAIL(ConfigError, "cannot reserve ", bytes, " bytes for the offload file ", m.path,
              " for ", what, ": ", std::strerror(err));
}

}  // namespace offload_file
}  // namespace dtorch::zero
