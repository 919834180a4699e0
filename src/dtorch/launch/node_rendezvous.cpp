// Node-level rendezvous through the launcher's store (see node_rendezvous.h): one key per node,
// polled, so a missing node is named by its rank.
#include "dtorch/launch/node_rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include <torch/csrc/distributed/c10d/Store.hpp>

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

std::string short_hostname() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  std::string h = host;
  return h.substr(0, h.find('.'));
}

std::string fqdn() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  // Python: gethostbyaddr(gethostname()), then the first of its name and aliases with a dot.
  struct hostent* by_name = ::gethostbyname(name);
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
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
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

// Note [Node rendezvous]
// Workers also rendezvous (Communicator::create names missing ranks), but only after
// DTORCH_TIMEOUT, and a rank number does not say which machine never started. Launchers meet
// first, under --rdzv-timeout, one key per node (Note [Announce and wait], the workers' loop
// too): when a node is missing, the message names its node rank and the hosts of those that
// came. Every node waits for all, so no worker anywhere
// starts before the job is whole; node 0, which serves the store, also waits until every node
// has seen the roll complete, so it cannot finish and take the store away before they have.
NodeRoll meet_nodes(c10d::Store& store, int node_rank, int nnodes, const std::string& host,
                    std::chrono::milliseconds timeout, const WaitNotice& notice) {
  const std::string me = host.empty() ? "?" : host;  // a host without a name still arrives
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string ready_prefix = "dtorch/launch/ready/";
  // Note [Announce and wait]; a store that goes away means node 0's launcher did.
  auto meet = [&](const std::string& prefix) {
    Arrivals seen;
    try {
      announce_and_wait(store, prefix, node_rank, me, nnodes, deadline, seen, notice);
      return NodeRoll{nnodes, seen.values};
    } catch (const std::exception& e) {
      std::string why = e.what();
      DTORCH_FAIL(CommError, "rendezvous failed: the store went away while this node waited (",
                  why.substr(0, why.find('\n')), "), so node 0's launcher gave up or exited; ",
                  describe_missing_nodes(NodeRoll{nnodes, seen.values}),
                  " as far as this node saw");
    }
  };
  // Phase 1: every node's arrival. Phase 2 (node 0 only): every node has seen phase 1 end.
  // Node 0 serves the store and leaves once its workers are done; without phase 2 a job whose
  // workers finish at once could end before a slower node saw the roll complete.
  NodeRoll roll = meet("dtorch/launch/node/");
  if (roll.missing().empty()) {
    if (node_rank != 0) {
      store.set(ready_prefix + std::to_string(node_rank),
                std::vector<uint8_t>(me.begin(), me.end()));
      return roll;
    }
    NodeRoll ready = meet(ready_prefix);
    if (ready.missing().empty()) return roll;
    roll = ready;  // the nodes that never confirmed count as missing
  }
  DTORCH_FAIL(CommError, "rendezvous failed after ", timeout.count() / 1000.0,
              " s (--rdzv-timeout): ", describe_missing_nodes(roll),
              "\n---> HINT: start `dtorch launch --node-rank <i>` on each missing node with the "
              "same --nnodes, --master-addr and --master-port (in a batch job, check that the "
              "job step runs on every node), or raise --rdzv-timeout if they start late");
}

}  // namespace dtorch::launch
