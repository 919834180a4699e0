// write_file_atomically (atomic_file.h): temporary file, fsync, rename, fsync of the directory.
#include "dtorch/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::optional<std::string> write_file_atomically(const std::string& path, const char* data,
                                                 size_t n) {
  return write_file_atomically(path, [&](const ByteSink& sink) { sink(data, n); });
}

std::optional<std::string> write_file_atomically(const std::string& path,
                                                 const std::function<void(const ByteSink&)>& fill) {
  const std::string parent = paths::parent_path(path);
  const std::string dir = parent.empty() ? "." : parent;
  const std::string tmp = str(path, ".", ::getpid(), ".tmp");
  const std::string hint = "; the previous file at that path, if any, is untouched";
  // rename() would replace a device node or a FIFO itself, and a directory's emptiness decides
  // whether it goes: only a file is ever replaced (Note [Input files] in core/input_file.h).
  if (const std::string kind = paths::kind(path); !kind.empty() && kind != "a regular file")
    return str("will not write ", path, ": it is ", kind,
               ", and dtorch replaces only regular files; give the path of a file");

  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return str("cannot create ", tmp, ": ", errno_text(),
               " (does the directory exist and is it writable?)", hint);
  }
  bool ok = true;
  std::string why;
  try {
    fill([&](const char* data, size_t n) {
      if (ok && !paths::write_fully(fd, data, n)) {
        ok = false;
        why = "write: " + errno_text();
      }
      return ok;
    });
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // fsync before rename: otherwise a power loss can leave the new name on an empty file.
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    why = "fsync: " + errno_text();
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    why = "close: " + errno_text();
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    why = "rename to " + path + ": " + errno_text();
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return str("cannot write ", path, ": ", why, " (disk full or not writable?)", hint);
  }
  // fsync the directory so the rename itself survives a crash.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return std::nullopt;
}

}  // namespace dtorch
