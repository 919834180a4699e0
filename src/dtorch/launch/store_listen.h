// Where a served rendezvous store listens: on the address its clients are given, not on every
// interface, so that nobody outside the job reaches it (Note [Where the store listens]).
#pragma once

#include <string>
#include <vector>

#include "dtorch/launch/store.h"

namespace dtorch::launch {

/// Note [Where the store listens]
/// A store serves the processes of one job; anyone else who reaches its port can write its keys
/// and, on LibTorch's classic server, stall it (Note [TCPStore backend]). So with --rdzv-listen
/// auto, the default, a served store listens only on the address its clients are given:
///   - the address that name (--master-addr, --rdzv-endpoint's host, or for a round of a c10d
///     job this host's name, which its workers get as MASTER_ADDR) resolves to on this host,
///     IPv4 first: 127.0.0.1 for a one-node job, --master-addr's default;
///   - in a job of several nodes, the first address that is not a loopback one; when a host
///     name resolves here to loopback addresses only (Debian's /etc/hosts maps the host name to
///     127.0.1.1, while the other nodes resolve it to the real one), every interface, saying why.
///     A loopback address given as such (127.0.0.1, localhost) stays on the loopback: all of
///     that job's nodes run on this host.
/// --rdzv-listen all listens on every interface (LibTorch's own choice); --rdzv-listen ADDRESS
/// on that address. The launcher binds the socket itself and hands it to LibTorch
/// (TCPStoreOptions::masterListenFd, from LibTorch 2.4); an older LibTorch (1.13) binds every
/// interface whatever is asked, and docs/launch.md says so.

/// Whether this LibTorch serves a store on a socket it is handed, so the address is honoured.
constexpr bool kStoreListensWhereAsked = kStoreHasLibuv;

/// Where a served store listens: `address` ("" for every interface), and `note`, a line for the
/// user when auto chose every interface.
struct ListenPlan {
  std::string address;
  std::string note;
};

/// The plan for --rdzv-listen `given` ("auto", "all" or an address) for clients that reach the
/// store through `host`, in a job of several nodes or of one. `resolved`: the addresses of this
/// host that `host` (or the ADDRESS given) resolves to, as local_addresses gives them; none
/// means another host's name, whose connection then fails by name. Pure: tested without
/// sockets. Throws ConfigError for an ADDRESS that is not this host's.
ListenPlan plan_listen(const std::string& given, const std::string& host,
                       const std::vector<std::string>& resolved, bool multi_node);

/// plan_listen with `host` (or the ADDRESS given) resolved by local_addresses.
ListenPlan plan_listen(const std::string& given, const std::string& host, bool multi_node);

/// The addresses of this host that `host` resolves to, numeric, in getaddrinfo's order with
/// IPv4 first; empty when it does not resolve or names another host.
std::vector<std::string> local_addresses(const std::string& host);

/// Whether a numeric address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x).
bool is_loopback_address(const std::string& address);

/// A TCP socket listening on numeric `address`:`port` (0: a free port), close-on-exec.
/// Throws CommError naming the port and address, and the fix when the port is in use.
int listen_on(const std::string& address, int port);

/// The port socket `fd` is bound to.
int bound_port(int fd);

}  // namespace dtorch::launch
