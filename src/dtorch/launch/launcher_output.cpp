// Console and RankLogs (launcher_output.h): the launcher's stdout and stderr, and one log file per
// rank of this node.
#include "dtorch/launch/launcher_output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::launch {
namespace {

bool same_file(int a, int b) {
  struct stat sa, sb;
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return;  // closed reader (EPIPE) or a full disk: drop output rather than stop the job
    }
  }
}

}  // namespace

Console::Console() : shared_(same_file(STDOUT_FILENO, STDERR_FILENO)) {}

void Console::write(int fd, int owner, const std::string& text) {
  if (text.empty()) return;
  int& cr_owner = cr_owner_[shared_ ? 0 : fd == STDERR_FILENO];
  if (cr_owner != kNone && cr_owner != owner) write_all(fd, "\n", 1);
  write_all(fd, text.data(), text.size());
  // Bare '\r's move no text: whatever was pending stays pending.
  if (text.find_first_not_of('\r') != std::string::npos)
    cr_owner = text.back() == '\r' ? owner : kNone;
}

void Console::message(const std::string& line) {
  write(STDERR_FILENO, kLauncher, without_locations(line) + "\n");
}

RankLogs::RankLogs(const LaunchOptions& o, bool append) {
  if (o.log_dir.empty()) return;
  std::error_code ec;
  paths::create_directories(o.log_dir, ec);
  DTORCH_CHECK_T(ConfigError, !ec, "cannot create --log-dir ", o.log_dir, ": ", ec.message());
  for (int lr = 0; lr < o.nproc_per_node; ++lr) {
    std::string path = str(o.log_dir, "/rank", o.node_rank * o.nproc_per_node + lr, ".log");
    int fd = ::open(path.c_str(),
                    O_WRONLY | O_CREAT | (append ? 0 : O_TRUNC) | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      int e = errno;
      close_all();
      DTORCH_FAIL(ConfigError, "cannot write the log file ", path,
                  " (--log-dir): ", std::strerror(e));
    }
    fds_.push_back(fd);
  }
}

RankLogs::~RankLogs() {
  close_all();
}

void RankLogs::write(int lr, const std::string& text) const {
  if (fd(lr) >= 0) write_all(fd(lr), text.data(), text.size());
}

void RankLogs::close_all() {
  for (int fd : fds_)
    ::close(fd);
  fds_.clear();
}

}  // namespace dtorch::launch
