// Gloo device selection (see gloo_device.h): GLOO_SOCKET_IFNAME, loopback for single-host jobs,
// else the interface whose route reaches MASTER_ADDR.
#include "dtorch/comm/gloo_device.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "dtorch/comm/backend_compat.h"
#include "dtorch/core/env.h"
#include "dtorch/core/log.h"

namespace dtorch::comm {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

}  // namespace

std::string local_address_towards(const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::string found;
  for (addrinfo* a = res; a && found.empty(); a = a->ai_next) {
    int s = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    // connect() on a UDP socket only consults the routing table: no packet leaves the host.
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(s, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char host[NI_MAXHOST] = {0};
      if (::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof host, nullptr, 0,
                        NI_NUMERICHOST) == 0) {
        found = host;
      }
    }
    ::close(s);
  }
  ::freeaddrinfo(res);
  return found;
}

// Note [Gloo interface]
// Each rank binds Gloo to one local address and announces it to its peers through the store.
// Gloo's own default resolves this host's name, which on a multi-homed node (a management
// network beside InfiniBand, a container's bridge, a network namespace) may name an address
// the other nodes cannot reach, or none at all (then Gloo falls back to loopback and the ranks
// of other hosts hang until the timeout). The address the kernel would send from towards
// MASTER_ADDR is one every node can reach, since every node reaches the master. Order:
// GLOO_SOCKET_IFNAME (the user knows best), loopback when the master is local to this host,
// the route towards the master, and Gloo's default only when no route is found.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const launch::RankInfo& info) {
  if (auto ifname = env::get("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  }
  if (is_loopback(info.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  std::string local = local_address_towards(info.master_addr);
  if (!local.empty()) {
    log::debug("gloo: binding to ", local, ", this host's address towards MASTER_ADDR ",
               info.master_addr);
    return c10d::ProcessGroupGloo::createDeviceForHostname(local);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace dtorch::comm
