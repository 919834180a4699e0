// A fork server's requests: the client's side, and the wire both sides use. Everything here
// is plain POSIX, so that a small program can link it without LibTorch.
#include "dtorch/launch/fork_requests.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "dtorch/core/error.h"

namespace dtorch::launch {
namespace {

// A request's first message: its size, with descriptors attached (the worker's stdin, stdout
// and stderr; a fork server's request also its working directory and the socket to answer on).
struct Header {
  uint64_t size = 0;
  struct iovec iov = {&size, sizeof size};
  alignas(struct cmsghdr) char control[CMSG_SPACE(wire::kMaxRequestFds * sizeof(int))] = {};
  struct msghdr msg = {};

  Header() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  Header(const Header&) = delete;
  Header& operator=(const Header&) = delete;
  // The rest of the size when a stream socket moved only `n` bytes of it.
  char* rest(ssize_t n) { return reinterpret_cast<char*>(&size) + n; }
  std::size_t rest_size(ssize_t n) const { return sizeof size - static_cast<std::size_t>(n); }
};

// `name` in the abstract namespace: a NUL, then the name (no file; Linux only).
socklen_t abstract_address(const std::string& name, struct sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof addr.sun_path - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

}  // namespace

namespace wire {

std::string encode_request(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env) {
  std::string out;
  for (const auto* list : {&argv, &env}) {
    out += std::to_string(list->size());
    out += '\0';
    for (const auto& item : *list) {
      out += item;
      out += '\0';
    }
  }
  return out;
}

bool decode_request(const std::string& in, std::vector<std::string>& argv,
                    std::vector<std::string>& env) {
  std::size_t at = 0;
  auto next = [&](std::string& field) {
    const std::size_t end = in.find('\0', at);
    if (end == std::string::npos) return false;
    field = in.substr(at, end - at);
    at = end + 1;
    return true;
  };
  for (auto* list : {&argv, &env}) {
    std::string count;
    if (!next(count) || count.empty() || count.size() > 9 ||
        count.find_first_not_of("0123456789") != std::string::npos)
      return false;
    list->resize(std::stoul(count));
    for (auto& item : *list)
      if (!next(item)) return false;
  }
  return at == in.size();
}

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool readable_within(int fd, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  struct pollfd p = {fd, POLLIN, 0};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    return ready > 0;
  }
}

bool send_request(int sock, const std::string& request, const int* fds, std::size_t count) {
  if (count > kMaxRequestFds) return false;
  Header h;
  h.size = request.size();
  h.msg.msg_controllen = CMSG_SPACE(count * sizeof(int));
  struct cmsghdr* c = CMSG_FIRSTHDR(&h.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, count * sizeof(int));
  ssize_t n;
  do {
    n = ::sendmsg(sock, &h.msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n > 0 && write_all(sock, h.rest(n), h.rest_size(n)) &&
         write_all(sock, request.data(), request.size());
}

bool receive_request(int sock, std::string& request, int* fds, std::size_t count) {
  Header h;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &h.msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  const struct cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&h.msg) : nullptr;
  if (!c || c->cmsg_type != SCM_RIGHTS) return false;
  if (c->cmsg_len != CMSG_LEN(count * sizeof(int))) {
    for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i)
      ::close(reinterpret_cast<const int*>(CMSG_DATA(c))[i]);
    return false;
  }
  std::memcpy(fds, CMSG_DATA(c), count * sizeof(int));
  if (!read_all(sock, h.rest(n), h.rest_size(n)) || h.size > (1u << 30)) {
    for (std::size_t i = 0; i < count; ++i)
      ::close(fds[i]);
    return false;
  }
  request.resize(h.size);
  if (read_all(sock, request.data(), request.size())) return true;
  for (std::size_t i = 0; i < count; ++i)
    ::close(fds[i]);
  return false;
}

}  // namespace wire

using wire::read_all;
using wire::readable_within;

std::optional<ServedFork> request_fork(int server, const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env, int dir_fd,
                                       const std::array<int, 3>& streams) {
  int answer[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, answer) != 0) return std::nullopt;
  const int fds[5] = {streams[0], streams[1], streams[2], dir_fd, answer[1]};
  const bool sent = wire::send_request(server, wire::encode_request(argv, env), fds, 5);
  ::close(answer[1]);
  // The server answers at once (it forks and replies); a minute is for a machine at its limits.
  pid_t pid = -1;
  if (sent && readable_within(answer[0], 60) &&
      read_all(answer[0], reinterpret_cast<char*>(&pid), sizeof pid) && pid > 0)
    return ServedFork{pid, answer[0]};
  ::close(answer[0]);
  return std::nullopt;
}

std::optional<int> wait_served(const ServedFork& fork, double limit_seconds) {
  if (!readable_within(fork.status_fd, limit_seconds)) return std::nullopt;
  int status = 0;
  if (!read_all(fork.status_fd, reinterpret_cast<char*>(&status), sizeof status))
    throw Error(str("the fork server ended before process ", fork.pid, " did; its status is lost"));
  return status;
}

int listen_local(const std::string& name) {
  struct sockaddr_un addr;
  const socklen_t len = abstract_address(name, addr);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<struct sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int connect_local(const std::string& name) {
  struct sockaddr_un addr;
  const socklen_t len = abstract_address(name, addr);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 || !peer_is_this_user(fd)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool peer_is_this_user(int sock) {
  struct ucred peer = {};
  socklen_t peer_len = sizeof peer;
  return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) == 0 &&
         peer.uid == ::geteuid();
}

std::string fork_server_name(const std::string& what, const std::string& binary,
                             const std::vector<std::string>& env, const std::string& ignored) {
  struct stat st;
  if (::stat(binary.c_str(), &st) != 0) return "";
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, a field at a time
  auto mix = [&](const std::string& field) {
    for (const unsigned char c : field + '\0') {
      hash ^= c;
      hash *= 1099511628211ull;
    }
  };
  mix(binary);
  for (const auto n :
       {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
        static_cast<uint64_t>(st.st_mtim.tv_sec), static_cast<uint64_t>(st.st_mtim.tv_nsec),
        static_cast<uint64_t>(st.st_size)})
    mix(std::to_string(n));
  std::vector<std::string> kept;
  std::copy_if(env.begin(), env.end(), std::back_inserter(kept),
               [&](const std::string& e) { return ignored.empty() || e.rfind(ignored, 0) != 0; });
  std::sort(kept.begin(), kept.end());
  for (const auto& e : kept)
    mix(e);
  char name[96];
  std::snprintf(name, sizeof name, "dtorch-%s-%u-%016llx", what.c_str(), ::geteuid(),
                static_cast<unsigned long long>(hash));
  return name;
}

namespace {

// Starts the fork server (see connect_fork_server) and waits until it listens or found the
// name held by another, a minute at most: it says which with a byte on descriptor 3.
void start_fork_server(const std::string& binary, const std::string& variable,
                       const std::string& name) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    const int null = ::open("/dev/null", O_RDWR);
    if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(null, 1) < 0 || ::dup2(null, 2) < 0 ||
        ::dup2(ready[1], 3) < 0 || ::fcntl(3, F_SETFD, 0) != 0 || ::chdir("/") != 0)
      ::_exit(127);
    ::syscall(SYS_close_range, 4U, ~0U, 0U);
    ::setenv(variable.c_str(), name.c_str(), 1);
    char* args[] = {const_cast<char*>(binary.c_str()), nullptr};
    ::execv(binary.c_str(), args);
    ::_exit(127);
  }
  ::close(ready[1]);
  if (pid > 0) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    char answer;
    if (readable_within(ready[0], 60)) (void)!::read(ready[0], &answer, 1);
  }
  ::close(ready[0]);
}

}  // namespace

int connect_fork_server(const std::string& binary, const std::string& variable,
                        const std::string& name) {
  if (name.empty()) return -1;
  int server = connect_local(name);
  for (int attempt = 0; server < 0 && attempt < 5; ++attempt) {
    if (attempt == 0) {
      start_fork_server(binary, variable, name);
    } else {
      ::usleep(100 * 1000);  // the server that holds the name has yet to listen
    }
    server = connect_local(name);
  }
  return server;
}

}  // namespace dtorch::launch
