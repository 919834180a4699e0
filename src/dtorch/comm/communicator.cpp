// Communicator: how one is made, for the whole job or split from it as a process group, its
// rendezvous, and the connection of its backends. Failure diagnosis, the shared-memory set-up
// and the collectives are in communicator_diagnosis.cpp, communicator_shm.cpp and
// communicator_collectives.cpp.
#include "dtorch/comm/communicator.h"

#include <torch/cuda.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "dtorch/comm/communicator_internal.h"
#include "dtorch/comm/gloo_device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/log.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/store.h"

namespace dtorch::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::join;
using detail::parse_entry;
using std::chrono::milliseconds;

std::string entry_text(const launch::RankInfo& info) {
  return str(launch::host_name(), " pid ", getpid(), " node ", info.node_rank);
}

// Note [Broken pipes]
// Gloo writes to its sockets with writev, which raises SIGPIPE once the peer has closed its end,
// and SIGPIPE's default action ends the process without a word: a rank whose peer finished early
// or died would vanish (the launcher reports "killed by signal 13") instead of naming that peer.
// Python ignores SIGPIPE at start-up, which is why PyTorch never meets this. A worker ignores it
// when it connects, unless the program installed a handler of its own; the write then fails with
// EPIPE, Gloo throws, and the collective's diagnosis names the rank.
void ignore_broken_pipes() {
  struct sigaction current;
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

namespace detail {

std::optional<RendezvousEntry> parse_entry(const std::string& text) {
  const auto pid_at = text.rfind(" pid "), node_at = text.rfind(" node ");
  if (pid_at == std::string::npos || node_at == std::string::npos || node_at < pid_at)
    return std::nullopt;
  RendezvousEntry e;
  e.host = text.substr(0, pid_at);
  try {
    e.pid = static_cast<pid_t>(std::stol(text.substr(pid_at + 5, node_at - pid_at - 5)));
    e.node = std::stoi(text.substr(node_at + 6));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return e;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace detail

CommOptions comm_options_from_env() {
  CommOptions o;
  if (auto s = env::get_seconds("DTORCH_TIMEOUT")) o.timeout = milliseconds(long(*s * 1000));
  if (auto b = env::get("DTORCH_BACKEND")) {
    DTORCH_CHECK_T(ConfigError, *b == "auto" || *b == "gloo" || *b == "nccl", "DTORCH_BACKEND='",
                   *b, "' is not one of auto, gloo, nccl");
    o.backend = *b;
  }
  if (auto g = env::get("DTORCH_GLOO_COLLECTIVES")) {
    DTORCH_CHECK_T(ConfigError, *g == "auto" || *g == "native" || *g == "dtorch",
                   "DTORCH_GLOO_COLLECTIVES='", *g, "' is not one of auto, native, dtorch");
    o.gloo_collectives = *g;
  }
  DTORCH_CHECK_T(ConfigError, o.gloo_collectives != "native" || kGlooHasReduceScatter,
                 "DTORCH_GLOO_COLLECTIVES=native needs LibTorch 2.x: Gloo in ", TORCH_VERSION,
                 " has no reduce-scatter; use auto or dtorch");
  return o;
}

std::vector<std::string> compiled_backends() {
#ifdef DTORCH_WITH_NCCL
  return {"gloo", "nccl"};
#else
  return {"gloo"};
#endif
}

// ---- Communicator ----------------------------------------------------------------------

Communicator::Communicator(launch::RankInfo info, CommOptions opts)
    : info_(std::move(info)), opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {}

Communicator::~Communicator() {
  if (size() > 1 && impl_->store && !impl_->store_silent) {
    // Lets a peer still waiting in a collective tell "finished early" from "died".
    try {
      impl_->root_store->setTimeout(milliseconds(1000));
      impl_->store->set("left/" + std::to_string(rank()), std::vector<uint8_t>{1});
    } catch (...) {
    }
  }
}

std::shared_ptr<Communicator> Communicator::from_env(const CommOptions& opts) {
  return create(launch::rank_info_from_env(), opts);
}

std::shared_ptr<Communicator> Communicator::create(const launch::RankInfo& info,
                                                   const CommOptions& opts) {
  std::shared_ptr<Communicator> c(new Communicator(info, opts));
  Impl& m = *c->impl_;
  m.global_ranks.resize(info.world_size);
  std::iota(m.global_ranks.begin(), m.global_ranks.end(), 0);
  if (info.world_size == 1) {
    m.root_store = c10::make_intrusive<c10d::HashStore>();
    m.store = m.root_store;
    return c;
  }
  log::set_rank(info.rank);
  // Like torchrun: the launcher serves the store if it says so, otherwise rank 0 does.
  if (info.launcher_hosts_store || info.rank != 0) {
    m.root_store = launch::connect_store(info.master_addr, info.master_port, opts.timeout);
    launch::check_store_job(*m.root_store, info.run_id,
                            str(info.master_addr, ":", info.master_port));
  } else {
    m.root_store = launch::serve_store(info.master_port, info.world_size, opts.timeout);
  }
  c->connect(c10::make_intrusive<c10d::PrefixStore>(
      "dtorch/attempt" + std::to_string(info.restart_count), m.root_store));
  return c;
}

// Note [Process groups]
// A group is a communicator of its own over a namespace of the job's store ("group/<name>:
// <ranks>/<k>", k counting earlier splits of the same group on this rank), so its rendezvous,
// sequence numbers and failure keys never meet another group's. Each member learns which
// members share its node from the node index every rank posted at the job's rendezvous, so a
// group within one node of a multi-node job still takes the shared-memory path. Gloo makes
// connections between the group's members only: non-members need not take part.
std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks,
                                                  const std::string& name) {
  DTORCH_CHECK_T(ConfigError, !name.empty() && name.find('/') == std::string::npos,
                 "split: a group needs a name without '/', got '", name, "'");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  DTORCH_CHECK_T(ConfigError,
                 !sorted.empty() && sorted.front() >= 0 && sorted.back() < size() &&
                     std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                 "split '", name, "': ranks must be distinct ranks of this communicator (0..",
                 size() - 1, ")");
  auto me = std::find(ranks.begin(), ranks.end(), rank());
  DTORCH_CHECK_T(ConfigError, me != ranks.end(), "split '", name, "': rank ", rank(),
                 " is not among the group's ranks; only members call split");
  std::string key = name + ":";
  for (size_t i = 0; i < ranks.size(); ++i)
    key += (i ? "," : "") + std::to_string(ranks[i]);
  int k;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    k = impl_->splits[key]++;
  }

  launch::RankInfo gi = info_;
  gi.rank = static_cast<int>(me - ranks.begin());
  gi.world_size = static_cast<int>(ranks.size());
  gi.local_rank = 0;
  gi.local_world_size = 0;
  for (int r : ranks) {
    if (node_of(r) != info_.node_rank) continue;
    if (r == rank()) gi.local_rank = gi.local_world_size;
    ++gi.local_world_size;
  }
  std::shared_ptr<Communicator> c(new Communicator(gi, opts_));
  Impl& m = *c->impl_;
  for (int r : ranks)
    m.global_ranks.push_back(impl_->global_ranks[r]);
  m.group_name = name;
  if (gi.world_size == 1) {
    m.root_store = c10::make_intrusive<c10d::HashStore>();
    m.store = m.root_store;
    return c;
  }
  m.root_store = impl_->root_store;
  c->connect(c10::make_intrusive<c10d::PrefixStore>(str("group/", key, "/", k), impl_->store));
  return c;
}

bool Communicator::uses_shared_memory() const {
  return impl_->shm != nullptr;
}

int Communicator::global_rank(int r) const {
  return impl_->global_ranks.at(r);
}

const std::string& Communicator::group_name() const {
  return impl_->group_name;
}

int Communicator::node_of(int r) const {
  if (size() == 1) return info_.node_rank;
  return impl_->nodes.at(r);  // see connect
}

std::string Communicator::describe_rank(int r) const {
  if (impl_->group_name.empty()) return std::to_string(r);
  return str(global_rank(r), " (", impl_->group_name, " rank ", r, ")");
}

void Communicator::connect(c10::intrusive_ptr<c10d::Store> store) {
  Impl& m = *impl_;
  const launch::RankInfo& info = info_;
  const CommOptions& opts = opts_;
  m.store = std::move(store);

  // Rendezvous: every rank announces itself, then waits for all, naming the missing ones.
  // Note [Announce and wait]
  auto names = [&](const launch::Arrivals& a) {
    std::vector<std::string> missing;
    for (int r : a.missing())
      missing.push_back(describe_rank(r));
    return missing;
  };
  launch::WaitNotice notice;
  notice.say = [&](const launch::Arrivals& a, double seconds) {
    log::info("waiting for rank(s) ", join(names(a)), " to reach the rendezvous",
              group_name().empty() ? "" : " of group ", group_name(), " at ", info.master_addr, ":",
              info.master_port, " for ", std::lround(seconds), " s of DTORCH_TIMEOUT's ",
              opts.timeout.count() / 1000.0, " s");
  };
  launch::Arrivals seen;
  launch::announce_and_wait(*m.store, "arrived/", info.rank, entry_text(info), info.world_size,
                            Clock::now() + opts.timeout, seen, notice);
  const std::vector<std::string> missing = names(seen);
  DTORCH_CHECK_T(CommError, missing.empty(), "rendezvous", group_name().empty() ? "" : " of group ",
                 group_name(), " at ", info.master_addr, ":", info.master_port, " timed out after ",
                 opts.timeout.count() / 1000.0,
                 " s: ", info.world_size - static_cast<int>(missing.size()), " of ",
                 info.world_size, " ranks arrived; missing rank(s) ", join(missing),
                 "\n---> HINT: those ranks did not start or cannot reach the store; check "
                 "that every node runs the launcher with the same --master-addr/--master-port "
                 "and --nnodes, or raise DTORCH_TIMEOUT");
  m.nodes.clear();
  for (int r = 0; r < info.world_size; ++r) {
    const auto entry = parse_entry(seen.values[r]);
    DTORCH_CHECK_T(CommError, entry, "rendezvous", group_name().empty() ? "" : " of group ",
                   group_name(), " at ", info.master_addr, ":", info.master_port, ": rank ",
                   describe_rank(r), " announced '", seen.values[r],
                   "', not '<host> pid <pid> node <node_rank>'",
                   "\n---> HINT: every rank of a job must run the same dtorch build");
    m.nodes.push_back(entry->node);
  }

  ignore_broken_pipes();  // Note [Broken pipes]
  try {
    if (opts.backend != "nccl") {
      auto o = c10d::ProcessGroupGloo::Options::create(opts.timeout);
      o->devices.push_back(make_gloo_device(info));
      m.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("gloo", m.store), info.rank, info.world_size, o);
    }
#ifdef DTORCH_WITH_NCCL
    if (opts.backend != "gloo" && torch::cuda::is_available()) {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = opts.timeout;
      m.nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", m.store), info.rank, info.world_size, o);
    }
#endif
  } catch (const std::exception& e) {
    m.root_store->setTimeout(detail::kStoreAnswers);
    const std::string missing = detail::missing_from_gloo(
        *m.store, info.rank, info.world_size, [this](int r) { return describe_rank(r); });
    DTORCH_FAIL(
        CommError, "creating the process group", group_name().empty() ? "" : " ", group_name(),
        " failed on rank ", describe_rank(info.rank), ": ", first_line(e.what()),
        missing.empty() ? "" : str("; rank(s) ", missing, " had not posted their Gloo address"),
        missing.empty()
            ? "\n---> HINT: on several hosts, set GLOO_SOCKET_IFNAME to the network "
              "interface the nodes share (e.g. ib0 or eth0)"
            : "\n---> HINT: those ranks died, were stopped or were stuck before creating "
              "it (look at their logs first); a slow start needs a longer DTORCH_TIMEOUT");
  }
  m.worker = std::make_unique<OrderedThread>();
  setup_shared_memory();
}

c10d::Store& Communicator::store() {
  return *impl_->store;
}

}  // namespace dtorch::comm
