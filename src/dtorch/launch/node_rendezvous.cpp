// Rolls of nodes and this host's names (see node_rendezvous.h).
#include "dtorch/launch/node_rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include "dtorch/core/error.h"

namespace dtorch::launch {

std::vector<int> NodeRoll::missing() const {
  std::vector<int> m;
  for (int i = 0; i < nnodes; ++i)
    if (hosts[static_cast<std::size_t>(i)].empty()) m.push_back(i);
  return m;
}

std::string describe_missing_nodes(const NodeRoll& roll) {
  std::string arrived, missing;
  int n_arrived = 0;
  for (int i = 0; i < roll.nnodes; ++i) {
    const std::string& h = roll.hosts[static_cast<std::size_t>(i)];
    if (h.empty()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    } else {
      arrived += str(arrived.empty() ? "" : ", ", "node ", i, " on ", h);
      ++n_arrived;
    }
  }
  return str(n_arrived, " of ", roll.nnodes, " node(s) arrived", arrived.empty() ? "" : " (",
             arrived, arrived.empty() ? "" : ")", "; missing node rank(s): ", missing);
}

std::string host_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

std::string short_hostname() {
  const std::string h = host_name();
  return h.substr(0, h.find('.'));
}

std::string fqdn() {
  const std::string name = host_name();
  if (name.empty()) return "localhost";
  // Python: gethostbyaddr(gethostname()), then the first of its name and aliases with a dot.
  struct hostent* by_name = ::gethostbyname(name.c_str());
  if (!by_name || by_name->h_addrtype != AF_INET || !by_name->h_addr_list[0]) return name;
  struct hostent* h = ::gethostbyaddr(by_name->h_addr_list[0], sizeof(in_addr), AF_INET);
  if (!h) return name;
  std::string primary = h->h_name;
  if (primary.find('.') != std::string::npos) return primary;
  for (char** a = h->h_aliases; a && *a; ++a)
    if (std::strchr(*a, '.')) return *a;
  return primary;
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == short_hostname()) return true;
  if (!host.empty() && host == host_name()) return true;
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  struct addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  struct ifaddrs* ifs = nullptr;
  bool local = false;
  if (::getifaddrs(&ifs) == 0) {
    for (struct addrinfo* a = found; a && !local; a = a->ai_next) {
      for (struct ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != a->ai_family) continue;
        if (a->ai_family == AF_INET) {
          local = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
                  reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        } else if (a->ai_family == AF_INET6) {
          local = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
                              &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                              sizeof(in6_addr)) == 0;
        }
      }
    }
    ::freeifaddrs(ifs);
  }
  // 127.x answers locally even where no interface lists it.
  for (struct addrinfo* a = found; a && !local; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      local = (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
  }
  ::freeaddrinfo(found);
  return local;
}

}  // namespace dtorch::launch
