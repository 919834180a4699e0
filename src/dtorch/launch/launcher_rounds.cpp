// The launcher's rounds (Note [One rendezvous for launchers]): the launchers of a job of several
// nodes, or of an elastic one, meet, start their workers for a round, watch each other, and
// restart every node's workers together or end the job on every node.
#include <cmath>
#include <optional>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/launch/elastic_rendezvous.h"
#include "dtorch/launch/launcher_internal.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/store.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A c10d round's store for its workers: node 0 serves it on a free port (or, for LibTorch
// 1.13's workers, leaves the port to rank 0) and publishes where; the other nodes read it.
c10::intrusive_ptr<c10d::Store> round_store(Plan& plan, const Round& round, ElasticRendezvous& rdzv,
                                            std::chrono::milliseconds timeout, Console& console) {
  plan.round = round.number;
  plan.agent_store = compat::kTorch2;  // Note [Torchrun's environment by version]
  c10::intrusive_ptr<c10d::Store> store;
  if (round.node_rank == 0) {
    plan.master_addr = fqdn();
    if (plan.agent_store) {
      store = serve_store(0, plan.world_size, timeout,
                          listen_address(plan.opts, plan.master_addr, console));
      plan.master_port = served_port(store);
      claim_store_for_job(*store, plan.run_id, str("port ", plan.master_port));
    } else {
      plan.master_port = free_port();
    }
    rdzv.publish("master", plan.master_addr + " " + std::to_string(plan.master_port));
  } else {
    std::string m = rdzv.read("master");
    plan.master_addr = m.substr(0, m.find(' '));
    plan.master_port = static_cast<int>(number_in_store(m.substr(m.find(' ') + 1), "master"));
  }
  return store;
}

}  // namespace

// Note [One rendezvous for launchers]
// Every job of several nodes runs in rounds of Note [Elastic rendezvous]. A c10d job's
// launchers meet at --rdzv-endpoint, are numbered on arrival and go on with MIN..MAX nodes;
// each round's node 0 serves a fresh store for the workers on a free port and gives them its
// host name (torchrun's MASTER_ADDR and MASTER_PORT), so workers of one round never meet keys
// of another. A static job (--node-rank given) is the same rounds with the node ranks given and
// MIN = MAX = --nnodes: node 0's launcher serves the store at --master-addr:--master-port for
// the whole job, the launchers meet there, and the workers use it too (each restart in a
// namespace of its own, TORCHELASTIC_RESTART_COUNT). So a static job's nodes watch each
// other's heartbeats, a failed worker stops and restarts every node's workers together (or
// ends the job, naming the rank, on every node), and a node whose launcher is lost ends the job
// within the heartbeat's timeout.
int run_rounds(const Plan& base, Console& console, c10::intrusive_ptr<c10d::Store> served) {
  const LaunchOptions& o = base.opts;
  const bool fixed = o.rdzv_backend == RdzvBackend::Static;
  const RdzvConf& conf = o.rdzv_conf;
  const double join_s =
      !fixed && conf.join_timeout_given ? conf.join_timeout : o.rdzv_timeout_seconds;
  const auto join_ms = std::chrono::milliseconds(static_cast<long long>(join_s * 1000));
  const Endpoint at = fixed ? Endpoint{base.master_addr, base.master_port} : o.rdzv_endpoint;
  // The endpoint's host serves the store; with several launchers on that host, the first does.
  if (!fixed && is_local_host(at.host)) {
    try {
      served = serve_store(at.port, 1, join_ms, listen_address(o, at.host, console));
    } catch (const CommError&) {
      log::debug("launch: the rendezvous store on port ", at.port,
                 " is served already (another launcher on this host)");
    }
  }
  auto connect = [&] { return connect_store(at.host, at.port, join_ms); };
  ElasticConfig cfg;
  cfg.run_id = base.run_id;
  cfg.endpoint = str(at.host, ":", at.port);
  cfg.min_nodes = min_nodes(o);
  cfg.max_nodes = o.nnodes;
  cfg.conf = conf;
  cfg.conf.join_timeout = join_s;
  cfg.max_restarts = o.max_restarts;
  cfg.host = short_hostname();
  if (fixed) {
    cfg.node_rank = o.node_rank;
    cfg.join_timeout_flag = "--rdzv-timeout";
  }
  ElasticRendezvous rdzv(fixed ? connect_to_node_zero(base) : connect(), connect, cfg);
  const ElasticRendezvous::Waiting waiting = [&](const std::string& who, double seconds) {
    console.message(str("dtorch launch: ", fixed ? str("node ", o.node_rank, " ") : "",
                        "waiting for the other nodes at ", at.host, ":", at.port, " for ",
                        std::lround(seconds), " s of ", fixed ? "--rdzv-timeout" : "join_timeout",
                        " ", join_s, " s: ", who));
  };
  std::optional<Clock::time_point> deadline;
  if (o.timeout_seconds > 0) {
    deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.timeout_seconds * 1000));
  }
  // Note [Elastic rendezvous]: whoever serves a store keeps it until the others are done with it:
  // the job's store until every launcher left, a round's node 0 its workers' store until the
  // round's other nodes finished.
  auto leave = [&](bool serving, int code) {
    if (serving) {
      rdzv.wait_for_peers(conf.close_timeout, [&](const std::string& hosts) {
        console.message(str("dtorch launch: keeping the rendezvous store up until ", hosts,
                            " leave the job (at most ", conf.close_timeout,
                            " s, --rdzv-conf close_timeout)"));
      });
    }
    return code;
  };
  auto leave_round = [&](const Round& round, int code) {
    if (served) return leave(true, code);
    if (round.node_rank == 0) {
      rdzv.wait_for_round(conf.close_timeout, [&](const std::string& hosts) {
        console.message(str("dtorch launch: keeping this round's store up until ", hosts,
                            " finish (at most ", conf.close_timeout,
                            " s, --rdzv-conf close_timeout)"));
      });
    }
    return code;
  };
  for (bool first = true;; first = false) {
    std::optional<Round> round;
    try {
      round = rdzv.join(waiting);
    } catch (const CommError&) {
      leave(bool(served), 1);
      throw;
    }
    if (!round) {
      console.message("dtorch launch: the job finished while this node waited to join it");
      return leave(bool(served), 0);
    }
    Plan plan = base;
    plan.opts.node_rank = round->node_rank;
    plan.opts.nnodes = round->nnodes;
    plan.world_size = round->nnodes * o.nproc_per_node;
    std::string who;
    for (int i = 0; i < round->nnodes; ++i)
      who += str(i ? ", " : "", "n", i, " ", round->hosts[static_cast<std::size_t>(i)]);
    // A static job's workers meet in node 0's store, as the launchers did.
    c10::intrusive_ptr<c10d::Store> workers_store;
    if (fixed) {
      if (first && o.node_rank == 0)
        console.message(str("dtorch launch: all ", o.nnodes, " nodes arrived (", who, ")"));
    } else {
      workers_store = round_store(plan, *round, rdzv, join_ms, console);
      const int first_rank = round->node_rank * o.nproc_per_node;
      console.message(str("dtorch launch: round ", round->number, ": ", round->nnodes, " node(s) (",
                          who, "); this node is n", round->node_rank, ", ranks ", first_rank, "..",
                          first_rank + o.nproc_per_node - 1, " of ", plan.world_size));
    }
    RankLogs logs(plan.opts, !first);
    // Per round: between rounds a signal ends the launcher at once (its heartbeat stops, and the
    // others count it lost).
    SignalWatch signals(signal_number(o.checkpoint_signal));
    plan.logs = &logs;
    std::optional<RoundEnd> ended;
    bool store_lost = false;
    auto watch = [&]() -> bool {
      if (store_lost) return false;
      try {
        ended = rdzv.poll();
      } catch (const std::exception& e) {
        store_lost = true;
        std::string why = e.what();
        console.message(str("dtorch launch: lost the rendezvous store at ", at.host, ":", at.port,
                            " (", why.substr(0, why.find('\n')),
                            "); the workers go on, but "
                            "this node can no longer restart them"));
      }
      return ended.has_value();
    };
    AttemptEnd end;
    try {
      end = run_attempt(plan, round->restarts, console, signals, deadline, watch);
    } catch (const SpawnError& e) {
      console.message(str("dtorch launch: ", e.what()));
      return e.exit_code();
    }
    int code = 1;
    switch (end.how) {
      case End::Success:
        rdzv.finish();
        return leave_round(*round, 0);
      case End::Checkpointed:
        rdzv.finish();
        return leave_round(*round, checkpointed(plan, console));
      case End::Signalled:
      case End::TimedOut:
        return stopped_by_launcher(end, o, console);
      case End::WorkerFailed: {
        std::string failure = describe_failure(plan, end.failure);
        console.message(failure);
        logs.write(end.failure.local_rank, failure + "\n");
        code = exit_code_of(end.failure.status);
        ended = rdzv.end_round(RoundCause::Failure,
                               str("rank ", end.failure.rank, " on ",
                                   round->hosts[static_cast<std::size_t>(round->node_rank)], " ",
                                   describe_status(end.failure.status)));
        break;
      }
      case End::RoundEnded:
        break;
    }
    if (ended->fail) {
      console.message(str("dtorch launch: the job fails: ", ended->why));
      return leave(bool(served), code);
    }
    if (fixed) {
      console.message(str("dtorch launch: ", ended->why, "; restarting all workers (restart ",
                          round->restarts + 1, " of ", o.max_restarts, ")"));
    } else {
      console.message(str("dtorch launch: round ", round->number, " ends: ", ended->why,
                          "; stopping this node's workers and meeting again"));
    }
  }
}

}  // namespace dtorch::launch
