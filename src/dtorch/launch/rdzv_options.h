// torchrun's rendezvous flags as values: --rdzv-backend, --rdzv-endpoint HOST[:PORT],
// --rdzv-conf key=value,... and --nnodes N or MIN:MAX. Pure parsing, so a typo is named with
// its flag before any launcher waits for another.
#pragma once

#include <string>

namespace dtorch::launch {

/// How the launchers of a job meet. Static: every node is told --node-rank, and the job has
/// exactly --nnodes nodes. C10d: node ranks are assigned on arrival at the endpoint's store, and
/// the job goes on with between min_nodes and max_nodes nodes (Note [Elastic rendezvous]).
enum class RdzvBackend { Static, C10d };

/// --rdzv-conf, in torchrun's names and with its defaults (seconds).
struct RdzvConf {
  double join_timeout = 600;       ///< a round fails when fewer than MIN nodes came by then
  double last_call_timeout = 30;   ///< once MIN have come, how long to wait for more
  double close_timeout = 30;       ///< how long the store's host waits for the others to finish
  double keep_alive_interval = 5;  ///< seconds between a launcher's heartbeats
  int keep_alive_max_attempt = 3;  ///< heartbeats missed before a launcher counts as lost
  bool join_timeout_given = false;
  /// Seconds without a heartbeat after which a launcher counts as lost.
  double lost_after() const { return keep_alive_interval * keep_alive_max_attempt; }
};

struct Endpoint {
  std::string host;
  int port = 0;
};

/// "c10d" or "static" (torchrun also says "etcd"/"etcd-v2", which dtorch names as unsupported).
RdzvBackend parse_rdzv_backend(const std::string& v);

/// "HOST", "HOST:PORT" or "[V6ADDR]:PORT"; `default_port` when none is given. Throws ConfigError
/// naming --rdzv-endpoint.
Endpoint parse_endpoint(const std::string& v, int default_port);

/// "key=value,key=value" with torchrun's keys; an unknown key or a bad value is a ConfigError
/// that lists the keys dtorch knows.
RdzvConf parse_rdzv_conf(const std::string& v);

struct NodeRange {
  int min = 1;
  int max = 1;
};

/// --nnodes "N" or "MIN:MAX".
NodeRange parse_node_range(const std::string& v);

}  // namespace dtorch::launch
