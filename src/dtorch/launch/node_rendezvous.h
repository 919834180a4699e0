// What launchers know of nodes: a roll of node ranks and the hosts that came (named in the
// rendezvous's messages, launch/elastic_rendezvous.h), and this host's names.
#pragma once

#include <string>
#include <vector>

namespace dtorch::launch {

/// Who had arrived when the rendezvous ended. hosts[i] is node i's host name ("" if missing).
struct NodeRoll {
  int nnodes = 0;
  std::vector<std::string> hosts;
  std::vector<int> missing() const;
};

/// "1 of 2 node(s) arrived (node 0 on hostA); missing node rank(s): 1".
std::string describe_missing_nodes(const NodeRoll& roll);

/// This host's name as gethostname() gives it ("" when it has none).
std::string host_name();

/// This host's name up to the first dot ("" when it has none).
std::string short_hostname();

/// This host's fully qualified name as Python's socket.getfqdn() gives it (the name its address
/// resolves back to, preferring one with a dot): what torchrun's c10d backend gives workers as
/// MASTER_ADDR.
std::string fqdn();

/// Whether `host` (a name or an address) is this machine: "localhost", this host's name, or an
/// address that resolves to one of its interfaces.
bool is_local_host(const std::string& host);

}  // namespace dtorch::launch
