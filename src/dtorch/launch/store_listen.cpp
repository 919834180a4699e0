// Where a served store listens (Note [Where the store listens]): the plan, and the socket.
#include "dtorch/launch/store_listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dtorch/core/error.h"

namespace dtorch::launch {
namespace {

bool is_ipv4(const std::string& address) {
  return address.find(':') == std::string::npos;
}

}  // namespace

bool is_loopback_address(const std::string& a) {
  return a.rfind("127.", 0) == 0 || a == "::1" || a.rfind("::ffff:127.", 0) == 0;
}

ListenPlan plan_listen(const std::string& given, const std::string& host,
                       const std::vector<std::string>& resolved, bool multi_node) {
  if (given == "all") return {"", ""};
  if (given != "auto") {
    DTORCH_CHECK_T(ConfigError, !resolved.empty(), "--rdzv-listen ", given,
                   " is not an address or name of this host; give one of its addresses, or all "
                   "(every interface), or auto (the address --master-addr resolves to)");
    return {resolved.front(), ""};
  }
  if (resolved.empty()) return {"", ""};  // not this host's: connecting to it fails, by name
  if (!multi_node) return {resolved.front(), ""};
  auto reachable = std::find_if(resolved.begin(), resolved.end(),
                                [](const std::string& a) { return !is_loopback_address(a); });
  if (reachable != resolved.end()) return {*reachable, ""};
  const bool loopback_given = host == "localhost" || is_loopback_address(host);
  if (loopback_given) return {resolved.front(), ""};  // every node runs on this host
  return {"", str("the rendezvous store listens on every interface: ", host,
                  " resolves on this host to ", resolved.front(),
                  ", a loopback address the other nodes cannot reach. Give --master-addr an "
                  "address of this host that they reach to listen there only, or --rdzv-listen "
                  "all to choose every interface")};
}

ListenPlan plan_listen(const std::string& given, const std::string& host, bool multi_node) {
  const bool address_given = given != "auto" && given != "all";
  return plan_listen(given, host, local_addresses(address_given ? given : host), multi_node);
}

std::vector<std::string> local_addresses(const std::string& host) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return out;
  for (struct addrinfo* a = found; a; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) !=
        0)
      continue;
    if (std::find(out.begin(), out.end(), text) != out.end()) continue;
    const int probe = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);  // port 0: no claim
    const bool here = probe >= 0 && ::bind(probe, a->ai_addr, a->ai_addrlen) == 0;
    if (probe >= 0) ::close(probe);
    if (here) out.emplace_back(text);
  }
  ::freeaddrinfo(found);
  std::stable_partition(out.begin(), out.end(), is_ipv4);
  return out;
}

int listen_on(const std::string& address, int port) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  struct addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  DTORCH_CHECK_T(CommError,
                 ::getaddrinfo(address.c_str(), service.c_str(), &hints, &found) == 0 && found,
                 "cannot listen on ", address, ":", port, ": not a numeric address");
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int error = errno;
  bool ok = fd >= 0;
  if (ok) {
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as LibTorch's own socket
    ok = ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0;
    error = errno;
    if (!ok) ::close(fd);
  }
  ::freeaddrinfo(found);
  if (ok) return fd;
  DTORCH_CHECK_T(CommError, error != EADDRINUSE, "cannot serve the rendezvous store on port ", port,
                 " of ", address, ": it is in use (", std::strerror(error), ")",
                 "\n---> HINT: another job probably uses this port; pick another with "
                 "--master-port (or MASTER_PORT), or use --standalone for a free one");
  DTORCH_FAIL(CommError, "cannot serve the rendezvous store on port ", port, " of ", address, ": ",
              std::strerror(error));
}

int bound_port(int fd) {
  struct sockaddr_storage a = {};
  socklen_t len = sizeof a;
  DTORCH_CHECK_T(CommError, ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0,
                 "cannot read a socket's port: ", std::strerror(errno));
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace dtorch::launch
