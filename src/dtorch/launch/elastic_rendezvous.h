// The c10d rendezvous of `dtorch launch --rdzv-backend c10d`: launchers meet in rounds in the
// endpoint's store, are numbered on arrival, watch each other's heartbeats while their workers
// run, and agree on how each round ends (restart on the nodes left, or fail). See
// Note [Elastic rendezvous].
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtorch/launch/rdzv_options.h"

namespace c10d {
class Store;
}

namespace dtorch::launch {

struct ElasticConfig {
  /// --rdzv-id: the store belongs to one job (Note [One job per store] in launch/store.h).
  std::string run_id = "none";
  std::string endpoint;  ///< where the store is ("host:port"), for messages
  int min_nodes = 1;
  int max_nodes = 1;
  RdzvConf conf;
  int max_restarts = 0;  ///< failure restarts the job may take (joins are free)
  std::string host;      ///< this launcher's host name, for the others' messages
  /// A static job's node (--node-rank): its node rank in every round, where MIN = MAX and node
  /// rank 0 leads. -1: numbered on arrival.
  int node_rank = -1;
  /// The flag that sets conf.join_timeout, for messages.
  std::string join_timeout_flag = "--rdzv-conf join_timeout, or --rdzv-timeout";
};

/// One round's membership: the same on every node of the round.
struct Round {
  int number = 0;
  int node_rank = 0;
  int nnodes = 0;
  std::vector<std::string> hosts;  ///< by node rank
  int restarts = 0;  ///< failure restarts before this round (TORCHELASTIC_RESTART_COUNT)
};

/// Why a round ends, as the node that saw it first says.
enum class RoundCause {
  Failure,  ///< a worker failed: counts against --max-restarts
  Lost,     ///< a node stopped beating: counts, and the nodes left must be at least MIN
  Join,     ///< a node waits to join and the job has fewer than MAX: free
};

/// How a round ended, the same for every node of it.
struct RoundEnd {
  bool fail = false;  ///< the job ends (fewer than MIN nodes, or --max-restarts used up)
  std::string why;
};

class ElasticRendezvous {
 public:
  using Connect = std::function<c10::intrusive_ptr<c10d::Store>()>;

  /// `store` is the endpoint's store; `connect` opens a second connection to it for the
  /// heartbeat thread. Registers this launcher and starts beating.
  ElasticRendezvous(c10::intrusive_ptr<c10d::Store> store, Connect connect, ElasticConfig cfg);
  /// Stops beating and tells the others whether this launcher finished or gave up.
  ~ElasticRendezvous();
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  /// What a long wait for a round says, after 10 s and every 10 s after: who came so far
  /// ("1 of 2 node(s) arrived (node 0 on hostA); missing node rank(s): 1") and the seconds
  /// waited.
  using Waiting = std::function<void(const std::string& who, double seconds)>;

  /// Joins the next round and returns it once it has closed. Throws CommError when the round
  /// fails (fewer than MIN nodes by join_timeout, or lost nodes leave fewer than MIN), naming
  /// the nodes, or when this node's given rank is another's; returns nullopt when the job
  /// finished while this launcher waited to join.
  std::optional<Round> join(const Waiting& waiting = {});

  /// Called while the workers run: the end of the current round once any node has asked for
  /// it, after asking for it itself when a node of the round stopped beating or a node waits to
  /// join below MAX. nullopt: go on.
  std::optional<RoundEnd> poll();

  /// Ends the current round for every node, for `why`; returns the verdict all nodes share.
  RoundEnd end_round(RoundCause cause, const std::string& why, int lost = 0);

  /// This node's workers all succeeded.
  void finish();
  /// Waits until every other launcher of the job has left it (after success, failure or
  /// never having joined a round) or was lost, at most `seconds`: a node that serves a store
  /// keeps it until the others are done with it, so that none of them finds it gone before it
  /// read how the job ended. Past 5 s, `say` hears once which hosts are still there.
  void wait_for_peers(double seconds, const std::function<void(const std::string&)>& say = {});
  /// Waits until every other node of the current round reported success or was lost, at most
  /// `seconds`: node 0 serves the round's store for every node's workers. Not until they leave:
  /// the launcher serving the job's store waits for node 0 to leave, and node 0 would wait for
  /// it in turn until close_timeout.
  void wait_for_round(double seconds, const std::function<void(const std::string&)>& say = {});

  /// A value for the other nodes of the current round, and reading one (waits for it).
  void publish(const std::string& key, const std::string& value);
  std::string read(const std::string& key);

  int launcher_id() const { return id_; }

 private:
  std::string key(const std::string& k) const;
  std::string round_key(int round, const std::string& k) const;
  std::optional<Round> arrive(int round, std::chrono::steady_clock::time_point since);
  /// A static job's round: takes this node's given rank (CommError naming the host that holds
  /// it), announces it and waits for all.
  std::optional<Round> arrive_at_rank(int round);
  /// Who has come to `round`, by arrival.
  std::string who_came(int round);
  /// Says who has come when the wait has gone on for another 10 s.
  void tell_waiting(int round);
  Round roll(int round, int node_rank, int nnodes);
  void lead(int round, std::chrono::steady_clock::time_point since);
  /// The launchers that took arrival numbers 0..count-1 of `round`, in that order; -1 for a
  /// number whose launcher has yet to write its id, unless `wait` (then it waits for it).
  std::vector<int> arrivals(int round, int count, bool wait = false);
  /// Whether node `node_rank` of the current round is this node or reported success.
  bool finished(int node_rank);
  /// Launchers alive now (beating, not gone), by id; also fills `lost` with the hosts of those
  /// that stopped beating or gave up.
  std::vector<int> live_launchers(std::vector<std::string>* lost = nullptr);
  bool is_lost(int launcher);
  std::string host_of(int launcher);
  std::optional<RoundEnd> verdict(int round);
  /// Waits until `still_there` names no one, at most `seconds`; `say` as for wait_for_peers.
  void wait_until_gone(double seconds, const std::function<void(const std::string&)>& say,
                       const std::function<std::vector<std::string>()>& still_there);
  /// True when the job finished; throws CommError when it failed.
  bool job_ended();
  [[noreturn]] void fail_round(int round, const std::string& why);
  void beat_loop(c10::intrusive_ptr<c10d::Store> own);

  c10::intrusive_ptr<c10d::Store> store_;
  ElasticConfig cfg_;
  int id_ = -1;
  std::optional<Round> current_;
  Waiting waiting_;  // while join() runs
  std::chrono::steady_clock::time_point waiting_since_, next_notice_;
  std::vector<int> members_;  // launcher ids of the current round, by node rank
  bool finished_ = false;
  struct Seen {
    std::int64_t beat = -1;
    std::chrono::steady_clock::time_point changed;
  };
  std::map<int, Seen> seen_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread beater_;
};

}  // namespace dtorch::launch
