// Several hosts on one machine for tests: one network namespace per host, each with its own
// address on a bridge (10.<net>.0.<i+1>/24, the bridge in a namespace of its own, so the
// machine's own network is never touched), its own host name (unshare --uts), and an /etc/hosts
// that names every host (unshare --mount), so host names resolve as on a cluster. Needs root
// and iproute2; everything is removed again however the test ends.
#pragma once

#include <string>
#include <vector>

namespace dtorch::testing {

class NamespaceHosts {
 public:
  /// `n` hosts on subnet 10.<net>.0.0/24.
  NamespaceHosts(int n, int net);
  ~NamespaceHosts();
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  /// Why hosts cannot be made here (not root, no `ip`/`unshare`, no CAP_NET_ADMIN), or "".
  const std::string& unavailable() const { return why_; }
  const std::string& name(int i) const { return names_[static_cast<std::size_t>(i)]; }
  const std::string& address(int i) const { return addrs_[static_cast<std::size_t>(i)]; }
  /// argv that runs `command` on host i: its network, host name and /etc/hosts.
  std::vector<std::string> on(int i, const std::vector<std::string>& command) const;

 private:
  std::vector<std::string> ns_, names_, addrs_;
  std::string switch_ns_, hosts_file_, why_;
};

}  // namespace dtorch::testing
