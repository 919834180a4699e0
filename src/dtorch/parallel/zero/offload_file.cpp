// The offload folder's files (offload_file.h).
#include "dtorch/parallel/zero/offload_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
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
  const bool known = ::statvfs(dir.c_str(), &fs) == 0;
  const uint64_t available = known ? uint64_t{fs.f_bavail} * fs.f_frsize : 0;
  // The free space first: ext4 and XFS keep what a failing fallocate got before it ran out
  // until the file is closed, so asking for more than is free would fill the disk meanwhile
  // for every other process on it. Then fallocate, not posix_fallocate: where the filesystem
  // cannot reserve space, glibc's emulation would write the whole file, and fill the disk
  // before it failed; there the free space checked here stands.
  int err = known && available < bytes ? ENOSPC : 0;
  if (err == 0 && bytes && ::fallocate(m.fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    err = errno;
    if (err == EOPNOTSUPP) err = ::ftruncate(m.fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  }
  if (err == 0) return m;
  ::close(m.fd);
  DTORCH_CHECK_T(ConfigError, err != ENOSPC && err != EFBIG, "the offload folder ", dir, " has ",
                 available, " bytes (", gib(available), ") free, and ", what, " needs ", bytes,
                 " (", gib(bytes), "): free space there, or give --offload-dir a larger disk");
  DTORCH_FAIL(ConfigError, "cannot reserve ", bytes, " bytes for the offload file ", m.path,
              " for ", what, ": ", std::strerror(err));
}

std::string move_bytes(int fd, bool write, char* data, size_t n, size_t at) {
  for (size_t done = 0; done < n;) {
    char* p = data + done;
    const auto from = static_cast<off_t>(at + done);
    const ssize_t r = write ? ::pwrite(fd, p, n - done, from) : ::pread(fd, p, n - done, from);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? std::strerror(errno) : "the file ended";
    done += static_cast<size_t>(r);
  }
  return "";
}

std::shared_ptr<char> copy_and_map(int from, size_t bytes, const std::string& path,
                                   const std::string& dir, const std::string& what) {
  if (bytes == 0) return nullptr;
  const std::string copy = path + ".snapshot";
  const int fd = ::open(copy.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  DTORCH_CHECK_T(TrainingError, fd >= 0, what, ": cannot make ", copy,
                 " for a checkpoint in the background: ", std::strerror(errno));
  ::unlink(copy.c_str());  // it goes with the last tensor that reads it
  // The kernel copies where it can (copy_file_range: no byte through this process); else
  // through one buffer of whole pages, as an O_DIRECT file needs.
  std::string failed;
  off_t in = 0, out = 0;
  while (static_cast<size_t>(in) < bytes && failed.empty()) {
    const ssize_t n = ::copy_file_range(from, &in, fd, &out, bytes - in, 0);
    if (n > 0) continue;
    if (n < 0 && (errno == EINVAL || errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP))
      break;  // not here: the buffer below
    failed = n == 0 ? "the file ended early" : std::strerror(errno);
  }
  if (failed.empty() && static_cast<size_t>(in) < bytes) {
    constexpr size_t kChunk = size_t{4} << 20;
    void* buf = nullptr;
    if (::posix_memalign(&buf, 4096, kChunk) != 0) throw std::bad_alloc();
    const std::unique_ptr<void, decltype(&std::free)> hold(buf, &std::free);
    for (size_t at = static_cast<size_t>(in); at < bytes && failed.empty();) {
      const size_t n = std::min(kChunk, bytes - at);
      failed = move_bytes(from, /*write=*/false, static_cast<char*>(buf), n, at);
      if (failed.empty()) failed = move_bytes(fd, /*write=*/true, static_cast<char*>(buf), n, at);
      at += n;
    }
  }
  void* base = failed.empty() ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
                              : MAP_FAILED;
  if (failed.empty() && base == MAP_FAILED) failed = std::strerror(errno);
  ::close(fd);
  DTORCH_CHECK_T(TrainingError, failed.empty(), what, ": cannot copy ", path, " (", bytes,
                 " bytes) to ", copy, " for a checkpoint in the background: ", failed,
                 " (a full disk? save in the foreground, without --async-checkpoint, or free ",
                 "space in ", dir, ")");
  return std::shared_ptr<char>(static_cast<char*>(base), [bytes](char* p) { ::munmap(p, bytes); });
}

}  // namespace offload_file
}  // namespace dtorch::zero
