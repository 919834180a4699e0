// Network namespaces on a bridge as hosts (see namespace_hosts.h).
#include "launch/namespace_hosts.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "support/workers.h"

namespace dtorch::testing {
namespace {

int sh(const std::string& script) {
  int rc = std::system(("/bin/sh -c '" + script + "' >/dev/null 2>&1").c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

}  // namespace

NamespaceHosts::NamespaceHosts(int n, int net) {
  if (::geteuid() != 0) {
    why_ = "needs root to create network namespaces (ip netns)";
    return;
  }
  if (sh("command -v ip && command -v unshare && command -v mount") != 0) {
    why_ = "needs `ip` (Debian package iproute2), `unshare` and `mount` (util-linux)";
    return;
  }
  const std::string id = std::to_string(::getpid());
  switch_ns_ = "dtorch-sw" + std::to_string(net) + "-" + id;
  std::string script = "set -e; ip netns add " + switch_ns_ + "; ip -n " + switch_ns_ +
                       " link add br0 type bridge; ip -n " + switch_ns_ + " link set br0 up";
  std::string hosts = "127.0.0.1 localhost\n";
  for (int i = 0; i < n; ++i) {
    std::string k = std::to_string(i);
    ns_.push_back("dtorch-h" + std::to_string(net) + "-" + k + "-" + id);
    names_.push_back("dtorch-" + std::string(1, static_cast<char>('a' + i)) + id);
    addrs_.push_back("10." + std::to_string(net) + ".0." + std::to_string(i + 1));
    // Interface names have 15 characters at most.
    std::string va = "dt" + std::to_string(net % 100) + "x" + k + "a" + id.substr(0, 6);
    std::string vb = "dt" + std::to_string(net % 100) + "x" + k + "b" + id.substr(0, 6);
    const std::string& h = ns_.back();
    script += "; ip netns add " + h + "; ip link add " + va + " type veth peer name " + vb +
              "; ip link set " + va + " netns " + h + "; ip link set " + vb + " netns " +
              switch_ns_ + "; ip -n " + switch_ns_ + " link set " + vb + " master br0; ip -n " +
              switch_ns_ + " link set " + vb + " up; ip -n " + h + " addr add " + addrs_.back() +
              "/24 dev " + va + "; ip -n " + h + " link set " + va + " up; ip -n " + h +
              " link set lo up";
    hosts += addrs_.back() + " " + names_.back() + "\n";
  }
  hosts_file_ = scratch_dir("namespace-hosts-" + std::to_string(net)) + "/hosts";
  std::ofstream(hosts_file_) << hosts;
  if (sh(script) != 0) {
    why_ =
        "cannot create network namespaces on a bridge here (a container without "
        "CAP_NET_ADMIN/CAP_SYS_ADMIN?); tried: " +
        script;
  }
}

NamespaceHosts::~NamespaceHosts() {
  // Deleting a namespace takes its end of each veth pair, and so the pair, with it.
  for (const auto& n : ns_)
    sh("ip netns del " + n);
  if (!switch_ns_.empty()) sh("ip netns del " + switch_ns_);
}

std::vector<std::string> NamespaceHosts::on(int i, const std::vector<std::string>& command) const {
  // ip netns exec gives the network; unshare a host name and a mount table of its own, where
  // /etc/hosts names every host. Each step execs the next, so the pid is the command's.
  std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      "exec ip netns exec \"$0\" unshare --uts --mount sh -c "
      "'mount --bind \"$1\" /etc/hosts && hostname \"$0\" && shift && exec \"$@\"' \"$@\"",
      ns_[static_cast<std::size_t>(i)],
      name(i),
      hosts_file_};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

}  // namespace dtorch::testing
