// Which network interface Gloo binds to: the one that reaches the master, so that ranks on
// hosts with several interfaces (or in network namespaces) advertise an address peers can reach.
#pragma once

#include <memory>
#include <string>

#include "dtorch/launch/rank_info.h"

namespace gloo::transport {
class Device;
}

namespace dtorch::comm {

/// The local address this host sends from when it talks to `peer` (the source address the
/// routing table picks), found without sending a packet. Empty when `peer` does not resolve or
/// no route leads to it.
std::string local_address_towards(const std::string& peer);

/// The Gloo device for this rank. See Note [Gloo interface].
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const launch::RankInfo& info);

}  // namespace dtorch::comm
