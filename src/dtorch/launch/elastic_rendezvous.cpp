// Rounds, arrival numbering, heartbeats and verdicts of the c10d rendezvous, all through plain
// keys of the endpoint's store (see elastic_rendezvous.h).
#include "dtorch/launch/elastic_rendezvous.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/store.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(50);
// A wait for a round says who it waits for after this long, and again every time it passes.
constexpr auto kNoticeEvery = std::chrono::seconds(10);

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::optional<std::string> get_if(c10d::Store& s, const std::string& k) {
  if (!s.check({k})) return std::nullopt;
  auto v = s.get(k);
  return std::string(v.begin(), v.end());
}

double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The launcher id a round's "node/<k>" key holds: "<id>", or "<id> <host>" where the node ranks
// are given (arrive_at_rank).
int announced_id(const std::string& value, const std::string& key) {
  return static_cast<int>(number_in_store(value.substr(0, value.find(' ')), key));
}

// The host in what a static job's node announced: "<launcher id> <host>".
std::string host_announced(const std::string& value) {
  const auto space = value.find(' ');
  return space == std::string::npos ? "?" : value.substr(space + 1);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v)
    s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

// Note [Elastic rendezvous]
// torchrun's c10d backend, in keys of one store (dtorch/rdzv/<run id>/...), served by the
// launcher on the --rdzv-endpoint host:
// - Every launcher registers once (launchers, launcher/<id> = host) and a thread of its own adds
//   to beat/<id> every keep_alive_interval; whoever watches a launcher counts it lost after
//   keep_alive_max_attempt intervals without a beat (clocks of different hosts never compare).
//   A launcher that ends writes gone/<id>: "done" after success, "exit" otherwise.
// - Round r: a launcher takes the arrival number k = add(r<r>/arrive) - 1 and writes
//   r<r>/node/<k> = id. Arrival 0 leads the round: it closes it (r<r>/closed = n) when MAX have
//   come, last_call_timeout after MIN came, or, in a round after the first (when the job knows
//   who is alive), once MIN have come and every launcher still alive has. Arrivals 0..n-1 are the
//   round's nodes, node rank = arrival number; a later arrival joins round r+1, and its presence
//   there is how the running nodes learn that someone waits. The leader fails the round after
//   join_timeout with fewer than MIN, or at once when lost launchers leave fewer than MIN alive;
//   while round r-1 still runs the clock does not run, so a node waiting to join a full job waits
//   for the job.
// - A static job's nodes have their node ranks given (--node-rank) and MIN = MAX = --nnodes:
//   round r needs no leader. A node takes r<r>/rank/<k> (a second launcher with the same rank
//   is refused, naming the first one's host), announces r<r>/node/<k> = "<id> <host>" and waits
//   for all (Note [Announce and wait], the workers' loop too) until join_timeout
//   (--rdzv-timeout), then names the node ranks missing and the hosts of those that came.
// - While workers run, each launcher polls r<r>/verdict, the round's next arrivals and the
//   beats of its peers. The first to see a reason (its worker failed, a peer was lost, a node
//   waits below MAX) claims the round (add(r<r>/claim) == 1) and writes the verdict for all:
//   restart in round r+1, or fail when failures exceed --max-restarts (failures and lost nodes
//   count, joins do not, like torchrun) or lost nodes leave fewer than MIN. Everyone stops its
//   workers and reads the same verdict, so the nodes never disagree on whether to go on.
// - However the job ends, the launcher serving the store keeps it until every other launcher
//   has written gone/<id> or is lost (at most close_timeout): a launcher that failed a round
//   and left at once would take the reason with it, and the others would only learn that the
//   store went away.
ElasticRendezvous::ElasticRendezvous(c10::intrusive_ptr<c10d::Store> store, Connect connect,
                                     ElasticConfig cfg)
    : store_(std::move(store)), cfg_(std::move(cfg)) {
  claim_store_for_job(*store_, cfg_.run_id, cfg_.endpoint);
  id_ = static_cast<int>(store_->add(key("launchers"), 1) - 1);
  store_->set(key("launcher/" + std::to_string(id_)), bytes(cfg_.host.empty() ? "?" : cfg_.host));
  store_->add(key("beat/" + std::to_string(id_)), 1);
  beater_ = std::thread(&ElasticRendezvous::beat_loop, this, connect());
}

ElasticRendezvous::~ElasticRendezvous() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (beater_.joinable()) beater_.join();
  try {
    store_->set(key("gone/" + std::to_string(id_)), bytes(finished_ ? "done" : "exit"));
  } catch (const std::exception&) {
    // the store's host is gone: nobody is left to tell
  }
}

void ElasticRendezvous::beat_loop(c10::intrusive_ptr<c10d::Store> own) {
  const auto every = std::chrono::duration<double>(cfg_.conf.keep_alive_interval);
  const std::string k = key("beat/" + std::to_string(id_));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_cv_.wait_for(lk, every, [&] { return stop_; })) {
    lk.unlock();
    try {
      own->add(k, 1);
    } catch (const std::exception&) {
      return;  // the store went away; the main thread finds out on its next request
    }
    lk.lock();
  }
}

std::string ElasticRendezvous::key(const std::string& k) const {
  return "dtorch/rdzv/" + cfg_.run_id + "/" + k;
}

std::string ElasticRendezvous::round_key(int round, const std::string& k) const {
  return key("r" + std::to_string(round) + "/" + k);
}

std::string ElasticRendezvous::host_of(int launcher) {
  return get_if(*store_, key("launcher/" + std::to_string(launcher))).value_or("?");
}

bool ElasticRendezvous::is_lost(int launcher) {
  if (auto g = get_if(*store_, key("gone/" + std::to_string(launcher)))) return *g != "done";
  auto beat = store_->add(key("beat/" + std::to_string(launcher)), 0);
  auto now = Clock::now();
  Seen& s = seen_[launcher];
  if (s.beat != beat) s = Seen{beat, now};
  return secs(now - s.changed) > cfg_.conf.lost_after();
}

std::vector<int> ElasticRendezvous::live_launchers(std::vector<std::string>* lost) {
  std::vector<int> live;
  int n = static_cast<int>(store_->add(key("launchers"), 0));
  for (int l = 0; l < n; ++l) {
    if (get_if(*store_, key("gone/" + std::to_string(l))) == std::optional<std::string>("done"))
      continue;
    if (is_lost(l)) {
      if (lost) lost->push_back(host_of(l));
    } else {
      live.push_back(l);
    }
  }
  return live;
}

std::optional<Round> ElasticRendezvous::join(const Waiting& waiting) {
  waiting_ = waiting;
  waiting_since_ = Clock::now();
  next_notice_ = waiting_since_ + kNoticeEvery;
  struct Forget {
    Waiting& w;
    ~Forget() { w = nullptr; }
  } forget{waiting_};
  int r = 0;
  if (current_) {
    r = current_->number + 1;
  } else if (auto hint = get_if(*store_, key("round"))) {
    r = static_cast<int>(number_in_store(*hint, key("round")));
  }
  auto since = Clock::now();
  for (;; ++r) {
    try {
      if (auto round = arrive(r, since)) return round;
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = e.what();
      DTORCH_FAIL(CommError, "rendezvous failed: the store on the --rdzv-endpoint host went away (",
                  why.substr(0, why.find('\n')), "), so that host's launcher ended");
    }
    if (job_ended()) return std::nullopt;
  }
}

bool ElasticRendezvous::job_ended() {
  auto end = get_if(*store_, key("job_end"));
  if (!end) return false;
  DTORCH_CHECK_T(CommError, *end == "done",
                 "the job failed while this node waited to join it (see the other nodes' logs)");
  return true;
}

std::optional<Round> ElasticRendezvous::arrive(int r, Clock::time_point since) {
  if (cfg_.node_rank >= 0) return arrive_at_rank(r);
  int k = static_cast<int>(store_->add(round_key(r, "arrive"), 1) - 1);
  store_->set(round_key(r, "node/" + std::to_string(k)), bytes(std::to_string(id_)));
  if (k == 0) {
    store_->set(key("round"), bytes(std::to_string(r)));
    lead(r, since);
  }
  int leader = -1;
  for (;;) {
    if (auto closed = get_if(*store_, round_key(r, "closed"))) {
      int n = static_cast<int>(number_in_store(*closed, round_key(r, "closed")));
      if (k < n) return roll(r, k, n);
      return std::nullopt;  // late: the next round
    }
    if (auto failed = get_if(*store_, round_key(r, "failed"))) throw CommError(*failed);
    if (job_ended()) return std::nullopt;
    if (leader < 0) {
      if (auto l = get_if(*store_, round_key(r, "node/0")))
        leader = announced_id(*l, round_key(r, "node/0"));
    }
    if (leader >= 0 && leader != id_ && is_lost(leader)) {
      fail_round(r, str("rendezvous round ", r, " failed: the launcher that opened it (on ",
                        host_of(leader), ") was lost before closing it"));
    }
    tell_waiting(r);
    std::this_thread::sleep_for(kTick);
  }
}

std::optional<Round> ElasticRendezvous::arrive_at_rank(int r) {
  const int k = cfg_.node_rank, n = cfg_.max_nodes;
  const std::string prefix = round_key(r, "node/");
  if (store_->add(round_key(r, "rank/" + std::to_string(k)), 1) > 1) {
    auto v = store_->get(prefix + std::to_string(k));  // the first one announces just after
    DTORCH_FAIL(CommError, "node rank ", k, " is taken: the launcher on ",
                host_announced(std::string(v.begin(), v.end())),
                " joined this job with --node-rank ", k, " first",
                "\n---> HINT: give each node its own --node-rank, 0..", n - 1);
  }
  // Each node announces "<launcher id> <host>" (arrivals() reads the id), so the roll names
  // the hosts without asking the store, which may have gone away.
  auto roll_of = [&](const Arrivals& a) {
    NodeRoll roll{n, std::vector<std::string>(static_cast<std::size_t>(n))};
    for (std::size_t i = 0; i < a.values.size(); ++i)
      if (!a.values[i].empty()) roll.hosts[i] = host_announced(a.values[i]);
    return roll;
  };
  WaitNotice notice;
  notice.after = kNoticeEvery;
  notice.say = [&](const Arrivals& a, double seconds) {
    if (waiting_) waiting_(describe_missing_nodes(roll_of(a)), seconds);
  };
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(cfg_.conf.join_timeout));
  Arrivals came;
  bool all = false;
  try {
    const std::string me = str(id_, " ", cfg_.host.empty() ? "?" : cfg_.host);
    all = announce_and_wait(*store_, prefix, k, me, n, deadline, came, notice);
  } catch (const std::exception& e) {
    std::string why = e.what();
    DTORCH_FAIL(CommError, "rendezvous failed: the store went away while this node waited (",
                why.substr(0, why.find('\n')), "), so node 0's launcher gave up or exited; ",
                describe_missing_nodes(roll_of(came)), " as far as this node saw");
  }
  DTORCH_CHECK_T(CommError, all, "rendezvous failed after ", cfg_.conf.join_timeout, " s (",
                 cfg_.join_timeout_flag, "): ", describe_missing_nodes(roll_of(came)),
                 "\n---> HINT: start `dtorch launch --node-rank <i>` on each missing node with the "
                 "same --nnodes, --master-addr and --master-port (in a batch job, check that the "
                 "job step runs on every node), or raise --rdzv-timeout if they start late");
  return roll(r, k, n);
}

std::string ElasticRendezvous::who_came(int r) {
  const int count = static_cast<int>(store_->add(round_key(r, "arrive"), 0));
  std::vector<std::string> hosts;
  for (int id : arrivals(r, count))
    if (id >= 0) hosts.push_back(host_of(id));
  return str(count, " of at least ", cfg_.min_nodes, " node(s) arrived (", joined(hosts), ")");
}

void ElasticRendezvous::tell_waiting(int r) {
  const auto now = Clock::now();
  if (!waiting_ || now < next_notice_) return;
  next_notice_ = now + kNoticeEvery;
  waiting_(who_came(r), secs(now - waiting_since_));
}

void ElasticRendezvous::lead(int r, Clock::time_point since) {
  const int lo = cfg_.min_nodes, hi = cfg_.max_nodes;
  bool reached = false;  // MIN came, at `min_reached`
  Clock::time_point min_reached;
  auto close = [&](int n) { store_->set(round_key(r, "closed"), bytes(std::to_string(n))); };
  for (;; std::this_thread::sleep_for(kTick)) {
    if (job_ended()) return;
    bool previous_runs = r > 0 && store_->check({round_key(r - 1, "closed")}) &&
                         !store_->check({round_key(r - 1, "verdict")});
    auto now = Clock::now();
    if (previous_runs) {
      since = now;  // waiting to join a running job: no timeout while it runs
      reached = false;
      continue;
    }
    int count = static_cast<int>(store_->add(round_key(r, "arrive"), 0));
    if (count >= hi) return close(hi);
    std::vector<std::string> lost;
    std::vector<int> live = live_launchers(&lost);
    if (count >= lo) {
      if (!reached) min_reached = now;
      reached = true;
      std::vector<int> came = arrivals(r, count);
      // At the job's start launchers still come (srun starts them a little apart), so the
      // first round waits its last call; a later round knows who is alive.
      bool all_came = r > 0 && std::all_of(live.begin(), live.end(), [&](int l) {
                        return std::find(came.begin(), came.end(), l) != came.end();
                      });
      if (all_came || secs(now - min_reached) >= cfg_.conf.last_call_timeout) return close(count);
      tell_waiting(r);
      continue;
    }
    if (!lost.empty() && static_cast<int>(live.size()) < lo) {
      fail_round(r, str("rendezvous round ", r, " failed: lost ", joined(lost), "; ", live.size(),
                        " launcher(s) left, fewer than --nnodes MIN ", lo,
                        "\n---> HINT: start `dtorch launch` again on ", lo - live.size(),
                        " more node(s), or run with a smaller MIN (--nnodes MIN:MAX)"));
    }
    if (secs(now - since) >= cfg_.conf.join_timeout) {
      fail_round(
          r, str("rendezvous failed after ", cfg_.conf.join_timeout, " s (", cfg_.join_timeout_flag,
                 "): ", who_came(r), lost.empty() ? "" : "; lost: " + joined(lost),
                 "\n---> HINT: start `dtorch launch` with the same --rdzv-endpoint and "
                 "--rdzv-id on every node (in a batch job, check that the job step runs "
                 "on every node), or raise join_timeout if they start late"));
    }
    tell_waiting(r);
  }
}

void ElasticRendezvous::fail_round(int r, const std::string& why) {
  store_->set(round_key(r, "failed"), bytes(why));
  store_->set(key("job_end"), bytes("failed"));
  throw CommError(why);
}

std::vector<int> ElasticRendezvous::arrivals(int r, int count, bool wait) {
  std::vector<int> ids;
  for (int i = 0; i < count; ++i) {
    const std::string k = round_key(r, "node/" + std::to_string(i));
    std::optional<std::string> id;
    if (wait) {
      auto v = store_->get(k);  // a launcher writes its id just after taking its number
      id = std::string(v.begin(), v.end());
    } else {
      id = get_if(*store_, k);
    }
    ids.push_back(id ? announced_id(*id, k) : -1);
  }
  return ids;
}

Round ElasticRendezvous::roll(int r, int k, int n) {
  Round round{r, k, n, {}, static_cast<int>(store_->add(key("failures"), 0))};
  members_ = arrivals(r, n, /*wait=*/true);
  for (int l : members_)
    round.hosts.push_back(host_of(l));
  current_ = round;
  return round;
}

bool ElasticRendezvous::finished(int i) {
  return members_[static_cast<std::size_t>(i)] == id_ ||
         store_->check({round_key(current_->number, "done/" + std::to_string(i))});
}

std::optional<RoundEnd> ElasticRendezvous::verdict(int r) {
  auto v = get_if(*store_, round_key(r, "verdict"));
  if (!v) return std::nullopt;
  return RoundEnd{!v->empty() && v->front() == 'F', v->substr(1)};
}

std::optional<RoundEnd> ElasticRendezvous::poll() {
  DTORCH_CHECK(current_, "ElasticRendezvous::poll before join");
  const Round& round = *current_;
  if (auto v = verdict(round.number)) return v;
  if (round.nnodes < cfg_.max_nodes && store_->add(round_key(round.number + 1, "arrive"), 0) > 0) {
    auto first = get_if(*store_, round_key(round.number + 1, "node/0"));
    std::string who =
        first ? host_of(announced_id(*first, round_key(round.number + 1, "node/0"))) : "?";
    return end_round(RoundCause::Join, str("a node (", who, ") asks to join the ", round.nnodes,
                                           " running, up to ", cfg_.max_nodes, " (--nnodes)"));
  }
  std::vector<std::string> lost;
  for (int i = 0; i < round.nnodes; ++i) {
    if (finished(i)) continue;
    if (is_lost(members_[static_cast<std::size_t>(i)]))
      lost.push_back(str("node ", i, " (", round.hosts[static_cast<std::size_t>(i)], ")"));
  }
  if (lost.empty()) return std::nullopt;
  return end_round(RoundCause::Lost,
                   str("lost ", joined(lost), ": its launcher exited or sent no heartbeat for ",
                       cfg_.conf.lost_after(), " s"),
                   static_cast<int>(lost.size()));
}

RoundEnd ElasticRendezvous::end_round(RoundCause cause, const std::string& why, int lost) {
  DTORCH_CHECK(current_, "ElasticRendezvous::end_round before join");
  const int r = current_->number;
  if (store_->add(round_key(r, "claim"), 1) == 1) {
    RoundEnd v{false, why};
    int left = current_->nnodes - lost;
    if (cause == RoundCause::Lost && left < cfg_.min_nodes) {
      v = {true,
           cfg_.node_rank >= 0
               ? str(why, "; the job needs all ", cfg_.max_nodes, " nodes (--nnodes ",
                     cfg_.max_nodes,
                     "; under --rdzv-backend c10d, --nnodes MIN:MAX goes on with fewer)")
               : str(why, "; ", left, " node(s) left, fewer than --nnodes MIN ", cfg_.min_nodes)};
    } else if (cause != RoundCause::Join) {
      int failures = static_cast<int>(store_->add(key("failures"), 1));
      if (failures > cfg_.max_restarts) {
        v = {true, str(why, "; giving up: ",
                       cfg_.max_restarts == 0 ? std::string("--max-restarts is 0")
                                              : str("the job already restarted ", cfg_.max_restarts,
                                                    " time(s) (--max-restarts)"))};
      }
    }
    store_->set(round_key(r, "verdict"), bytes((v.fail ? "F" : "R") + v.why));
    if (v.fail) store_->set(key("job_end"), bytes("failed"));
    return v;
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;; std::this_thread::sleep_for(kTick)) {
    if (auto v = verdict(r)) return *v;
    DTORCH_CHECK_T(CommError, Clock::now() < deadline, "rendezvous round ", r,
                   ": another node claimed its end but wrote no verdict within 60 s");
  }
}

void ElasticRendezvous::finish() {
  finished_ = true;
  if (!current_) return;
  try {
    // job_end first: once done/<rank> is there, the store's host may leave.
    store_->set(key("job_end"), bytes("done"));
    store_->set(round_key(current_->number, "done/" + std::to_string(current_->node_rank)),
                bytes("1"));
  } catch (const std::exception& e) {
    // The store's host finished and left first: nobody waits for this node's word any more.
    log::debug("launch: could not record success in the rendezvous store: ", e.what());
  }
}

void ElasticRendezvous::wait_for_peers(double seconds,
                                       const std::function<void(const std::string&)>& say) {
  wait_until_gone(seconds, say, [&] {
    std::vector<std::string> there;
    int n = static_cast<int>(store_->add(key("launchers"), 0));
    for (int l = 0; l < n; ++l) {
      if (l != id_ && !store_->check({key("gone/" + std::to_string(l))}) && !is_lost(l))
        there.push_back(host_of(l));
    }
    return there;
  });
}

void ElasticRendezvous::wait_for_round(double seconds,
                                       const std::function<void(const std::string&)>& say) {
  DTORCH_CHECK(current_, "ElasticRendezvous::wait_for_round before join");
  wait_until_gone(seconds, say, [&] {
    std::vector<std::string> there;
    for (int i = 0; i < current_->nnodes; ++i) {
      if (!finished(i) && !is_lost(members_[static_cast<std::size_t>(i)]))
        there.push_back(current_->hosts[static_cast<std::size_t>(i)]);
    }
    return there;
  });
}

void ElasticRendezvous::wait_until_gone(
    double seconds, const std::function<void(const std::string&)>& say,
    const std::function<std::vector<std::string>()>& still_there) {
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  bool said = false;
  try {
    for (;; std::this_thread::sleep_for(kTick)) {
      const std::vector<std::string> there = still_there();
      auto now = Clock::now();
      if (there.empty() || now >= deadline) return;
      if (!said && say && secs(now - start) >= 5) {
        said = true;
        say(joined(there));
      }
    }
  } catch (const std::exception& e) {
    log::debug("launch: stopped waiting for the other nodes: ", e.what());
  }
}

void ElasticRendezvous::publish(const std::string& k, const std::string& value) {
  DTORCH_CHECK(current_, "ElasticRendezvous::publish before join");
  store_->set(round_key(current_->number, "kv/" + k), bytes(value));
}

std::string ElasticRendezvous::read(const std::string& k) {
  DTORCH_CHECK(current_, "ElasticRendezvous::read before join");
  const int r = current_->number;
  const int node0 = members_.front();
  for (;; std::this_thread::sleep_for(kTick)) {
    if (auto v = get_if(*store_, round_key(r, "kv/" + k))) return *v;
    if (auto v = verdict(r)) throw CommError(v->why);
    DTORCH_CHECK_T(CommError, !is_lost(node0), "rendezvous round ", r, ": node 0 (",
                   current_->hosts.front(), ") was lost before it published ", k);
  }
}

}  // namespace dtorch::launch
