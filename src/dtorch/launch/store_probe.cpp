// The TCPStore dialect probes of Note [TCPStore dialects] (store_probe.h), on plain sockets.
#include "dtorch/launch/store_probe.h"

#include <torch/version.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <regex>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kProbeWait = std::chrono::seconds(2);

// What one probe got back.
struct Answer {
  bool connected = false;
  size_t bytes = 0;     // read before the connection closed or the wait ended
  bool closed = false;  // the server closed (or reset) the connection
};

// Connects to addr:port, sends `probe` in one write, and reads for up to kProbeWait or until
// `want` bytes came or the server closed.
Answer ask(const std::string& addr, int port, const std::string& probe, size_t want) {
  Answer a;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return a;
  int fd = -1;
  for (addrinfo* p = found; p && fd < 0; p = p->ai_next) {
    fd = ::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
    if (fd >= 0 && ::connect(fd, p->ai_addr, p->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return a;
  a.connected = true;
  if (::send(fd, probe.data(), probe.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(probe.size())) {
    const auto deadline = Clock::now() + kProbeWait;
    char buf[64];
    while (a.bytes < want && !a.closed) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        a.closed = true;
      } else {
        a.bytes += static_cast<size_t>(n);
      }
    }
  }
  ::close(fd);
  return a;
}

std::string dialect_name(StoreDialect d) {
  return d == StoreDialect::Torch1 ? "PyTorch 1.x's" : "PyTorch 2.x's";
}

}  // namespace

StoreDialect probe_store_dialect(const std::string& addr, int port, StoreDialect first) {
  const auto answers = [&](StoreDialect d) {
    return d == StoreDialect::Torch2
               ? ask(addr, port, std::string("\x00\xce\xf7\x85\x3c\x07\x07\x07\x07", 9), 32)
               : ask(addr, port, std::string("\x06", 1), 8);
  };
  const Answer a = answers(first);
  if (a.bytes >= 8) return first;
  if (!a.connected) return StoreDialect::Unknown;  // not up yet: LibTorch's client waits for it
  const StoreDialect other =
      first == StoreDialect::Torch2 ? StoreDialect::Torch1 : StoreDialect::Torch2;
  return answers(other).bytes >= 8 ? other : StoreDialect::Unknown;
}

std::string torch_version_of_process(int pid) {
  std::ifstream maps(str("/proc/", pid, "/maps"));
  static const std::regex library(R"((/\S*/)libtorch_cpu\.so(\.([0-9][0-9.]*))?\s*$)");
  for (std::string line; std::getline(maps, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, library)) continue;
    if (m[3].matched) return m[3].str();  // Debian's soname carries the version
    // A wheel's torch/lib/libtorch_cpu.so: its torch/version.py says.
    std::ifstream py(paths::join(paths::parent_path(paths::parent_path(m[1].str())), "version.py"));
    static const std::regex version(R"(__version__\s*=\s*['"]([^'"]+)['"])");
    for (std::string v; std::getline(py, v);)
      if (std::smatch vm; std::regex_search(v, vm, version)) return vm[1].str();
    return "";
  }
  return "";
}

void check_store_dialect(const std::string& addr, int port) {
  const StoreDialect mine = TORCH_VERSION_MAJOR >= 2 ? StoreDialect::Torch2 : StoreDialect::Torch1;
  const StoreDialect theirs = probe_store_dialect(addr, port, mine);
  if (theirs == StoreDialect::Unknown || theirs == mine) return;
  // The launcher's PyTorch is the store's where the launcher served it (torchrun's agent).
  std::string parent = torch_version_of_process(static_cast<int>(::getppid()));
  if (parent.empty() || (parent[0] == '1') != (theirs == StoreDialect::Torch1)) parent.clear();
  DTORCH_FAIL(CommError, "the rendezvous store at ", addr, ":", port, " speaks ",
              dialect_name(theirs), " TCPStore protocol",
              parent.empty() ? "" : str(" (this process's launcher runs PyTorch ", parent, ")"),
              ", and this dtorch is built on LibTorch ", TORCH_VERSION, ", whose client speaks ",
              dialect_name(mine),
              ": the two never understand each other. Launch it with `dtorch launch` (torchrun's "
              "flags), with the torchrun of a PyTorch ",
              mine == StoreDialect::Torch1 ? "1.x" : "2.x",
              ", or use a dtorch built on the launcher's PyTorch");
}

}  // namespace dtorch::launch
