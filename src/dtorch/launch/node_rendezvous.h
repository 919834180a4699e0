// The launchers of a multi-node job meet in node 0's store before any worker starts, so a node
// that never comes is named after --rdzv-timeout instead of surfacing later as a hung collective.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dtorch/launch/store.h"

namespace c10d {
class Store;
}

namespace dtorch::launch {

/// Who had arrived when the rendezvous ended. hosts[i] is node i's host name ("" if missing).
struct NodeRoll {
  int nnodes = 0;
  std::vector<std::string> hosts;
  std::vector<int> missing() const;
};

/// Registers this node in `store` under "dtorch/launch/node/<node_rank>" (value: `host`), then
/// waits until all `nnodes` have, polling until `timeout` (Note [Announce and wait]; `notice`
/// says what a long wait waits for). Returns the roll on success; throws CommError naming how
/// many nodes arrived and the node ranks missing (see describe_missing_nodes) when the timeout
/// passes first.
NodeRoll meet_nodes(c10d::Store& store, int node_rank, int nnodes, const std::string& host,
                    std::chrono::milliseconds timeout, const WaitNotice& notice = {});

/// "1 of 2 node(s) arrived (node 0 on hostA); missing node rank(s): 1".
std::string describe_missing_nodes(const NodeRoll& roll);

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
