// Communicator: rendezvous, process groups, and every collective dtorch issues, with failures
// turned into errors that name the operation and the ranks that did not take part.
#include "dtorch/comm/communicator.h"

#include <torch/cuda.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>

#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include "dtorch/comm/backend_compat.h"
#include "dtorch/comm/gloo_device.h"
#include "dtorch/comm/shm_allreduce.h"
#include "dtorch/core/env.h"
#include "dtorch/core/log.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/store.h"

namespace dtorch::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Note [Failure diagnosis]
// Gloo reports a dead peer as "connection closed" and a stalled one as a timeout, without
// saying which rank is at fault. On failure every rank posts "failed/<rank>" (with the
// collective it was in) to the store and waits a short window for the others: ranks that
// post nothing are dead or stalled (dead for sure when they ran on this host and their pid is
// gone, stopped when that process is in state T: either ends the wait at once), ranks that
// posted "left/<rank>" finished early, and differing collectives mean the ranks called
// collectives in different orders. The first post has a shorter deadline of its own: a store
// that does not answer it is served by a process that is stopped or gone (rank 0, when the
// workers serve their own store), and saying so sooner ends the job sooner.
constexpr milliseconds kDiagnosisWindow{5000};
constexpr milliseconds kStoreAnswers{2000};

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // Gloo has no AVG in 1.13: sum, then divide after wait()
      return c10d::ReduceOp::SUM;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Gloo in LibTorch 1.13 cannot carry bfloat16: such tensors travel as float32.
bool needs_float_cast(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && !t.is_cuda() && !kGlooReducesBFloat16;
}

// Note [Collectives on CUDA streams]
// NCCL runs each collective on a communication stream of its own (ProcessGroupNCCL's), which at
// launch waits with an event for the work queued so far on the caller's current stream: a DDP
// bucket's allreduce, launched from the gradient hook as the bucket fills, starts once the
// kernels that produced its gradients have run, and overlaps the rest of backward. Work::wait()
// does not block the host: it makes the current stream wait for the collective's end event, so
// the optimizer's kernels (and a finish step such as averaging) queue behind it. The tensors a
// collective reads or writes are recorded as used by the communication stream
// (record_stream), so the caching allocator hands their memory to nothing else before the
// collective is done, even when dtorch drops them first (ZeRO's released units and buckets,
// Note [Spare unit memory]). A collective that never finishes is NCCL's watchdog's to end,
// after CommOptions::timeout.

// Note [CUDA tensors over Gloo]
// NCCL carries CUDA tensors, one GPU per rank (Note [One GPU per rank] in core/device.h). Where
// there is no NCCL (a job that set DTORCH_BACKEND=gloo, so that several ranks can share one GPU,
// or a CUDA LibTorch without NCCL) a CUDA tensor travels through host memory: copied to the
// host (which waits for the kernels that produce it), sent by the CPU path (shared memory or
// Gloo), and copied back once the operation completes. It is slow, and it lets the multi-rank
// code of every strategy run on CUDA tensors with one GPU.

std::string describe(const at::Tensor& t) {
  double mb = static_cast<double>(t.numel() * t.element_size()) / (1024.0 * 1024.0);
  std::ostringstream os;
  os.precision(3);
  os << t.numel() << " x " << t.scalar_type() << ", " << mb << " MiB";
  return os.str();
}

int64_t nbytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.nbytes());
}

// Note [Reduce-scatter on Gloo]
// LibTorch 1.13's Gloo has no reduce-scatter, and an allreduce whose result is mostly thrown
// away sends twice the bytes. Within one node the shared-memory path reads each rank's chunk
// straight from the others' slots. Otherwise a ring over send/recv: in step s rank r sends its
// running sum of chunk r-s-1 to rank r+1 and adds what rank r-1 sends into chunk r-s-2; after
// N-1 steps chunk r holds every rank's contribution. Each rank sends N-1 chunks, (N-1)/N of
// the input: the volume of a real reduce-scatter (and of NCCL's). Steps run one after
// another on the communicator's ordered thread; tags derived from the operation's sequence
// number keep concurrent collectives apart. That number must be the same on every rank, so
// point-to-point messages take none (ranks may send different numbers of them), and ring tags
// lie above the tags point-to-point may use (Communicator::kMaxTag).
constexpr long kRingTagBase = long(Communicator::kMaxTag) + 1;

void ring_reduce_scatter(Backend& pg, const at::Tensor& in, int rank, int n, long seq,
                         std::chrono::milliseconds timeout) {
  const int64_t c = in.numel() / n;
  auto chunk = [&](int i) { return in.narrow(0, ((i % n + n) % n) * c, c); };
  at::Tensor incoming = at::empty({c}, in.options());
  const int next = (rank + 1) % n, prev = (rank - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int tag = static_cast<int>(kRingTagBase + (seq * 1024 + s) % kRingTagBase);
    std::vector<at::Tensor> rv{incoming}, sv{chunk(rank - s - 1)};
    auto r = pg.recv(rv, prev, tag);
    auto w = pg.send(sv, next, tag);
    w->wait(timeout);
    r->wait(timeout);
    chunk(rank - s - 2).add_(incoming);
  }
}

// What a rank announces at the rendezvous, "<host> pid <pid> node <node_rank>": where its process
// runs, for a diagnosis, and its node, for node_of.
struct RendezvousEntry {
  std::string host;
  pid_t pid = 0;
  int node = 0;
};

std::string entry_text(const launch::RankInfo& info) {
  return str(launch::host_name(), " pid ", getpid(), " node ", info.node_rank);
}

// std::nullopt for an entry not of that form.
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

// What this host knows of rank r's process, when r ran here (its rendezvous entry names this
// host): gone (dead for sure), stopped (SIGSTOP, ^Z: state T in /proc), or nothing (another
// host, running, or the store cannot say).
enum class LocalProcess { Unknown, Gone, Stopped };

LocalProcess local_process(c10d::Store& store, int r) {
  try {
    auto v = store.get("arrived/" + std::to_string(r));
    const auto entry = parse_entry(std::string(v.begin(), v.end()));
    if (!entry || entry->host != launch::host_name()) return LocalProcess::Unknown;
    const pid_t pid = entry->pid;
    if (::kill(pid, 0) != 0 && errno == ESRCH) return LocalProcess::Gone;
    if (launch::is_stopped(pid)) return LocalProcess::Stopped;
  } catch (const std::exception&) {
  }
  return LocalProcess::Unknown;
}

// The ranks that had not posted their Gloo address to the store when creating the process group
// failed, each with what this host knows of its process ("0 (stopped: SIGSTOP or ^Z)"); empty
// when the store cannot tell. Gloo's key for rank R's address under the job's store is
// "gloo/0/rank_R" in LibTorch 1.13 and "gloo/0/R" in 2.x: the one that holds this rank's own
// address, which it posted before it waited for the others, is the one to look at.
std::string missing_from_gloo(c10d::Store& store, int rank, int world,
                              const std::function<std::string(int)>& name) {
  std::string missing;
  try {
    std::string prefix;
    for (const char* p : {"gloo/0/rank_", "gloo/0/"})
      if (prefix.empty() && store.check({str(p, rank)})) prefix = p;
    if (prefix.empty()) return "";
    auto posted = [&](int r) { return store.check({str(prefix, r)}); };
    for (int r = 0; r < world; ++r) {
      if (r == rank || posted(r)) continue;
      const LocalProcess here = local_process(store, r);
      missing += str(missing.empty() ? "" : ", ", name(r),
                     here == LocalProcess::Gone      ? " (its process on this host is gone)"
                     : here == LocalProcess::Stopped ? " (stopped: SIGSTOP or ^Z)"
                                                     : "");
    }
  } catch (const std::exception&) {
    return "";
  }
  return missing;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + v[i];
  return s;
}

// Posts each (key, value) to `store` and asks it one check (a set need not wait for an answer);
// false when that takes longer than `limit`. Asked from a thread of its own, because a LibTorch 2.x
// client blocks on a stopped server past any timeout of its own (the watchdog ends such a call
// only at its timeout + 3 s, Note [Store watchdog]): a thread that never returns is left
// behind, and the caller gives the store up. The store's own errors are rethrown.
// (A mutex and condition variable, not std::future::wait_for, whose libstdc++ symbol PyTorch's
// wheels export a copy of: LinkedSymbols.*)
bool posted_within(c10::intrusive_ptr<c10d::Store> store,
                   std::vector<std::pair<std::string, std::string>> posts, milliseconds limit) {
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto answer = std::make_shared<Answer>();
  std::thread([store, posts = std::move(posts), answer] {
    std::exception_ptr error;
    try {
      for (const auto& [key, value] : posts)
        store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      (void)store->check({posts.back().first});
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(answer->mu);
    answer->done = true;
    answer->error = error;
    answer->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(answer->mu);
  if (!answer->cv.wait_for(lock, limit, [&] { return answer->done; })) return false;
  if (answer->error) std::rethrow_exception(answer->error);
  return true;
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

// Runs jobs one at a time in submission order, off the caller's thread, so a shared-memory
// allreduce started from a gradient hook overlaps with the rest of backward like Gloo's does.
// Outside the anonymous namespace: Communicator::Impl, declared in the header, holds one.
// A finished job's captures are dropped on this thread, and they may hold the last reference
// to the communicator itself (a tensor whose autograd graph keeps a tensor-parallel region's
// group): the communicator is then destroyed here, and a thread cannot join itself. So the
// queue lives in a State the thread shares, and destroyed from its own thread an
// OrderedThread lets the thread go; it finds the stop flag and ends after that job.
class OrderedThread {
 public:
  OrderedThread() : thread_([s = state_] { loop(*s); }) {}
  ~OrderedThread() {
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->stop = true;
    }
    state_->cv.notify_one();
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  std::shared_future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::shared_future<void> f = task.get_future().share();
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->jobs.push_back(std::move(task));
    }
    state_->cv.notify_one();
    return f;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::packaged_task<void()>> jobs;
    bool stop = false;
  };
  static void loop(State& s) {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> l(s.mu);
        s.cv.wait(l, [&s] { return s.stop || !s.jobs.empty(); });
        if (s.jobs.empty()) return;
        task = std::move(s.jobs.front());
        s.jobs.pop_front();
      }
      task();
    }
  }
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;  // after state_: it starts with a copy of it
};

namespace {

// Whether every rank of the job is on this node and the shared-memory path may be used
// (DTORCH_SHM=0 turns it off).
bool single_node_shm_wanted(const launch::RankInfo& info) {
  return info.world_size > 1 && info.local_world_size == info.world_size &&
         env::get("DTORCH_SHM").value_or("1") != "0";
}

}  // namespace

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

// ---- Work ------------------------------------------------------------------------------

struct Work::State {
  std::shared_ptr<Communicator> comm;
  c10::intrusive_ptr<c10d::Work> work;  // a Gloo/NCCL operation, or null
  std::shared_future<void> local;       // a shared-memory operation, or invalid
  std::function<void()> finish;         // averaging / casting back, after completion
  std::string op;
  long seq = 0;
  int peer = -1;  // point-to-point: the other rank, the one failure diagnosis looks at
  bool done = false;
};

void Work::wait() {
  if (!state_ || state_->done) return;
  state_->done = true;
  TraceRange range("wait " + state_->op);
  try {
    if (state_->work) state_->work->wait(state_->comm->options().timeout);
    if (state_->local.valid()) state_->local.get();
  } catch (const std::exception& e) {
    state_->comm->fail(state_->op, state_->seq, e.what(), state_->peer);
  }
  if (state_->finish) state_->finish();
}

bool Work::completed() const {
  if (!state_ || state_->done) return true;
  if (state_->local.valid()) {
    return state_->local.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  return !state_->work || state_->work->isCompleted();
}

// ---- Communicator ----------------------------------------------------------------------

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> root_store;  // the TCPStore (or a HashStore alone)
  c10::intrusive_ptr<c10d::Store> store;       // namespaced to this restart attempt
  bool store_silent = false;  // a failure's diagnosis found it not answering: given up
  c10::intrusive_ptr<Backend> gloo;
  c10::intrusive_ptr<Backend> nccl;
  std::unique_ptr<ShmAllreduce> shm;      // Note [Shared-memory allreduce], single node only
  std::unique_ptr<OrderedThread> worker;  // multi-step collectives, in issue order
  std::mutex mu;  // collectives must be issued in one order; hooks may race to issue them
  long seq = 0;
  Traffic traffic;                    // guarded by mu
  std::vector<int> global_ranks;      // job-wide rank of each of this communicator's ranks
  std::string group_name;             // empty for the whole job
  std::map<std::string, int> splits;  // how often each group was split off here (under mu)
  std::vector<int> nodes;             // each rank's node_rank, from its rendezvous entry

  Backend& backend_for(const at::Tensor& t) {
    if (t.is_cuda()) {
      DTORCH_CHECK_T(CommError, nccl, "a CUDA tensor was passed to a collective, but this ",
                     "dtorch has no NCCL backend (built against a LibTorch without CUDA/NCCL, ",
                     "or DTORCH_BACKEND=gloo); move the tensor to the CPU or rebuild dtorch "
                     "against a CUDA LibTorch");
      return *nccl;
    }
    DTORCH_CHECK_T(CommError, gloo, "a CPU tensor was passed to a collective, but only the NCCL ",
                   "backend was created (DTORCH_BACKEND=nccl); use DTORCH_BACKEND=auto");
    return *gloo;
  }
};

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
    m.root_store->setTimeout(kStoreAnswers);
    const std::string missing = missing_from_gloo(*m.store, info.rank, info.world_size,
                                                  [this](int r) { return describe_rank(r); });
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

void Communicator::setup_shared_memory() {
  Impl& m = *impl_;
  if (!single_node_shm_wanted(info_) || !m.gloo) return;
  std::string why, name;
  try {
    if (rank() == 0) {
      name = str("/dtorch-", getpid(), "-", info_.restart_count, "-", std::random_device{}());
      m.store->set("shm/name", std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      auto v = m.store->get("shm/name");
      name.assign(v.begin(), v.end());
    }
  } catch (const std::exception& e) {
    // Rank 0 posts the name as soon as its group exists: one that has not within DTORCH_TIMEOUT
    // is gone or stalled, and the agreement below would wait as long again (a rank stopped
    // here ended the job after twice the timeout).
    fail("store get (rank 0's shared-memory segment name)", 0, e.what(), -1);
  }
  try {
    m.shm = std::make_unique<ShmAllreduce>(name, rank(), size(), opts_.timeout);
  } catch (const std::exception& e) {
    why = first_line(e.what());
  }
  // All ranks must take the same path, or their collectives would never meet.
  at::Tensor ok = at::full({1}, why.empty() ? 1 : 0, at::kInt);
  std::vector<at::Tensor> v{ok};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MIN;
  try {
    m.gloo->allreduce(v, o)->wait(opts_.timeout);
  } catch (const std::exception& e) {
    // Unnumbered (sequence 0): the user's first collective stays #1. Note [Failure diagnosis]
    fail(str("allreduce (whether every rank can use shared memory, ", describe(ok), ")"), 0,
         e.what(), -1);
  }
  if (ok.item<int>() == 1) return;
  m.shm.reset();
  if (!why.empty()) log::warn("shared-memory allreduce unavailable (", why, "); using Gloo");
}

c10d::Store& Communicator::store() {
  return *impl_->store;
}

// Builds the handle and numbers the operation; callers hold impl_->mu so that numbering and
// issuing happen in one order on every rank.
Work Communicator::new_work(const std::string& op, const std::string& what, const at::Tensor& t,
                            std::function<void()> finish, const char* path, bool numbered) {
  Work w;
  w.state_ = std::make_shared<Work::State>();
  auto& s = *w.state_;
  s.comm = shared_from_this();
  s.finish = std::move(finish);
  s.seq = numbered ? ++impl_->seq : 0;
  s.op = numbered ? str(op, " #", s.seq) : op;
  s.op += str(" (", what.empty() ? "" : what + ", ", describe(t), path, ")");
  return w;
}

Work Communicator::start(const std::string& op, const std::string& what, at::Tensor t,
                         const std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor&)>& launch,
                         std::function<void()> finish, const char* path, int peer) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Work w = new_work(op, what, t, std::move(finish), path, /*numbered=*/peer < 0);
  auto& s = *w.state_;
  s.peer = peer;
  if (size() == 1) return w;
  TraceRange range(s.op);
  try {
    s.work = launch(t);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    fail(s.op, s.seq, e.what(), peer);
  }
  return w;
}

Work Communicator::start_p2p(const std::string& op, at::Tensor t, int peer, int tag) {
  DTORCH_CHECK(t.is_contiguous(), op, " needs a contiguous tensor");
  DTORCH_CHECK(peer >= 0 && peer < size() && peer != rank(), op, ": peer ", peer,
               " is not another rank of this communicator (", size(), " ranks)");
  DTORCH_CHECK(tag >= 0 && tag <= kMaxTag, op, ": tag ", tag, " is outside 0..", kMaxTag);
  const bool sending = op == "send";
  if (sending) count(&Traffic::send, nbytes(t));
  return start(
      op, str(sending ? "to rank " : "from rank ", describe_rank(peer), ", tag ", tag), t,
      [this, sending, peer, tag](at::Tensor& b) {
        std::vector<at::Tensor> v{b};
        Backend& pg = impl_->backend_for(b);
        return sending ? pg.send(v, peer, tag) : pg.recv(v, peer, tag);
      },
      nullptr, "", peer);
}

Work Communicator::start_local(const std::string& op, const std::string& what, const at::Tensor& t,
                               std::function<void(long seq)> job, std::function<void()> finish,
                               const char* path) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Work w = new_work(op, what, t, std::move(finish), path);
  if (size() == 1) return w;
  TraceRange range(w.state_->op);
  w.state_->local =
      impl_->worker->submit([job = std::move(job), seq = w.state_->seq] { job(seq); });
  return w;
}

bool Communicator::native_collective(const at::Tensor& t) const {
  if (t.is_cuda()) return true;  // NCCL's own are the fast ones on GPUs
  if (opts_.gloo_collectives == "auto") return kGlooNativeIsFaster;
  return opts_.gloo_collectives == "native";
}

void Communicator::count(int64_t Traffic::*kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->traffic.*kind += bytes;
}

Traffic Communicator::traffic() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->traffic;
}

void Communicator::reset_traffic() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->traffic = Traffic();
}

bool Communicator::through_host(const at::Tensor& t) const {
  return t.is_cuda() && !impl_->nccl && size() > 1;
}

// Runs `finish` once `w` has completed (after its own finishing work).
Work Communicator::then(Work w, std::function<void()> finish) {
  if (!w.state_ || w.state_->done) {
    finish();
    return w;
  }
  w.state_->finish = [first = std::move(w.state_->finish), finish = std::move(finish)] {
    if (first) first();
    finish();
  };
  return w;
}

Work Communicator::allreduce_async(at::Tensor t, ReduceOp op, const std::string& what) {
  DTORCH_CHECK(t.is_contiguous(), "allreduce needs a contiguous tensor");
  if (through_host(t)) {  // Note [CUDA tensors over Gloo]
    at::Tensor host = t.cpu();
    return then(allreduce_async(host, op, what), [t, host]() mutable { t.copy_(host); });
  }
  DTORCH_CHECK(op != ReduceOp::Avg || t.is_floating_point(), "ReduceOp::Avg needs a floating ",
               "point tensor, got ", t.scalar_type());
  at::Tensor buf = t;
  bool cast = needs_float_cast(t);
  if (cast) buf = t.to(at::kFloat);
  int n = size();
  auto finish = [t, buf, op, n, cast]() mutable {
    if (op == ReduceOp::Avg && n > 1) buf.div_(n);
    if (cast) t.copy_(buf);
  };
  if (n > 1) count(&Traffic::allreduce, 2 * (n - 1) * nbytes(buf) / n);
  if (impl_->shm && ShmAllreduce::supports(buf) && (op == ReduceOp::Sum || op == ReduceOp::Avg)) {
    ShmAllreduce* shm = impl_->shm.get();
    return start_local(
        "allreduce", what, buf, [shm, buf](long) mutable { shm->sum(buf); }, std::move(finish),
        ", shared memory");
  }
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  return start(
      "allreduce", what, buf,
      [this, o](at::Tensor& b) {
        std::vector<at::Tensor> v{b};
        return impl_->backend_for(b).allreduce(v, o);
      },
      std::move(finish));
}

void Communicator::allreduce(at::Tensor t, ReduceOp op, const std::string& what) {
  allreduce_async(std::move(t), op, what).wait();
}

Work Communicator::broadcast_async(at::Tensor t, int root, const std::string& what) {
  DTORCH_CHECK(t.is_contiguous(), "broadcast needs a contiguous tensor");
  DTORCH_CHECK(root >= 0 && root < size(), "broadcast root ", root, " is not a rank");
  if (through_host(t)) {  // Note [CUDA tensors over Gloo]
    at::Tensor host = t.cpu();
    return then(broadcast_async(host, root, what), [t, host]() mutable { t.copy_(host); });
  }
  at::Tensor buf = t;
  bool cast = needs_float_cast(t);
  if (cast) buf = t.to(at::kFloat);
  if (size() > 1) count(&Traffic::broadcast, nbytes(buf));
  c10d::BroadcastOptions o;
  o.rootRank = root;
  return start(
      "broadcast", what, buf,
      [this, o](at::Tensor& b) {
        std::vector<at::Tensor> v{b};
        return impl_->backend_for(b).broadcast(v, o);
      },
      [t, buf, cast]() mutable {
        if (cast) t.copy_(buf);
      });
}

void Communicator::broadcast(at::Tensor t, int root, const std::string& what) {
  broadcast_async(std::move(t), root, what).wait();
}

Work Communicator::reduce_scatter_async(at::Tensor in, at::Tensor out, ReduceOp op,
                                        const std::string& what) {
  const int n = size();
  DTORCH_CHECK(in.is_contiguous() && out.is_contiguous() && in.dim() == 1 && out.dim() == 1,
               "reduce_scatter needs contiguous 1-D tensors");
  DTORCH_CHECK(in.numel() == out.numel() * n, "reduce_scatter input has ", in.numel(),
               " elements; it must be ", n, " x the output's ", out.numel());
  DTORCH_CHECK(in.scalar_type() == out.scalar_type() && in.is_floating_point(),
               "reduce_scatter needs floating point tensors of one dtype");
  DTORCH_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, "reduce_scatter supports Sum and Avg");
  if (n == 1) {
    if (!out.is_same(in)) out.copy_(in);
    if (op == ReduceOp::Avg) out.div_(1);
    return Work();
  }
  if (through_host(in) || through_host(out)) {  // Note [CUDA tensors over Gloo]
    at::Tensor host_in = in.cpu(), host_out = at::empty(out.sizes(), host_in.options());
    return then(reduce_scatter_async(host_in, host_out, op, what),
                [out, host_out]() mutable { out.copy_(host_out); });
  }
  at::Tensor buf = needs_float_cast(in) ? in.to(at::kFloat) : in;
  at::Tensor res = needs_float_cast(out) ? at::empty(out.sizes(), buf.options()) : out;
  count(&Traffic::reduce_scatter, (n - 1) * nbytes(buf) / n);
  auto finish = [out, res, op, n]() mutable {
    if (op == ReduceOp::Avg) res.div_(n);
    if (!res.is_same(out)) out.copy_(res);
  };
  if (impl_->shm && ShmAllreduce::supports(buf)) {
    ShmAllreduce* shm = impl_->shm.get();
    return start_local(
        "reduce_scatter", what, buf,
        [shm, buf, res](long) mutable { shm->reduce_scatter_sum(buf, res); }, std::move(finish),
        ", shared memory");
  }
  Backend* pg = &impl_->backend_for(buf);
  const int me = rank();
  if (native_collective(buf)) {
    // Gloo reads its input while writing the output: they must not overlap.
    at::Tensor target = res.is_alias_of(buf) ? at::empty_like(res) : res;
    return start(
        "reduce_scatter", what, buf,
        [pg, target](at::Tensor& b) mutable { return native_reduce_scatter(*pg, target, b); },
        [finish = std::move(finish), target, res]() mutable {
          if (!target.is_same(res)) res.copy_(target);
          finish();
        },
        ", native");
  }
  auto timeout = opts_.timeout;
  return start_local(
      "reduce_scatter", what, buf,
      [pg, buf, res, me, n, timeout](long seq) mutable {
        ring_reduce_scatter(*pg, buf, me, n, seq, timeout);
        at::Tensor mine = buf.narrow(0, me * res.numel(), res.numel());
        if (!res.is_same(mine)) res.copy_(mine);
      },
      std::move(finish), ", ring");
}

void Communicator::reduce_scatter(at::Tensor in, at::Tensor out, ReduceOp op,
                                  const std::string& what) {
  reduce_scatter_async(std::move(in), std::move(out), op, what).wait();
}

Work Communicator::allgather_into_async(at::Tensor out, at::Tensor in, const std::string& what) {
  const int n = size();
  DTORCH_CHECK(in.is_contiguous() && out.is_contiguous(),
               "allgather_into needs contiguous tensors");
  DTORCH_CHECK(out.numel() == in.numel() * n, "allgather_into output has ", out.numel(),
               " elements; it must be ", n, " x the input's ", in.numel());
  DTORCH_CHECK(in.scalar_type() == out.scalar_type(), "allgather_into: input is ", in.scalar_type(),
               " but output is ", out.scalar_type());
  at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
  if (n == 1) {
    if (!flat_out.is_same(flat_in)) flat_out.copy_(flat_in);
    return Work();
  }
  if (through_host(flat_in) || through_host(flat_out)) {  // Note [CUDA tensors over Gloo]
    at::Tensor host_in = flat_in.cpu(), host_out = at::empty(flat_out.sizes(), host_in.options());
    return then(allgather_into_async(host_out, host_in, what),
                [flat_out, host_out]() mutable { flat_out.copy_(host_out); });
  }
  count(&Traffic::allgather, (n - 1) * nbytes(out) / n);
  if (impl_->shm && !flat_in.is_cuda()) {
    ShmAllreduce* shm = impl_->shm.get();
    return start_local(
        "allgather", what, in,
        [shm, flat_in, flat_out](long) mutable { shm->allgather(flat_in, flat_out); }, nullptr,
        ", shared memory");
  }
  if (native_collective(flat_in)) {
    Backend* pg = &impl_->backend_for(flat_in);
    return start(
        "allgather", what, flat_in,
        [pg, flat_out](at::Tensor& b) mutable { return native_allgather_into(*pg, flat_out, b); },
        nullptr, ", native");
  }
  // Gloo moves bytes: reinterpret bfloat16, unknown to it in 1.13, as the same-size float16.
  auto wire = [](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 && !t.is_cuda() ? t.view(at::kHalf) : t;
  };
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < n; ++r)
    chunks.push_back(wire(flat_out.narrow(0, r * flat_in.numel(), flat_in.numel())));
  return start(
      "allgather", what, wire(flat_in),
      [this, chunks](at::Tensor& b) {
        std::vector<std::vector<at::Tensor>> outs{chunks};
        std::vector<at::Tensor> ins{b};
        return impl_->backend_for(b).allgather(outs, ins);
      },
      nullptr);
}

void Communicator::allgather_into(at::Tensor out, at::Tensor in, const std::string& what) {
  allgather_into_async(std::move(out), std::move(in), what).wait();
}

void Communicator::allgather(std::vector<at::Tensor>& out, const at::Tensor& in,
                             const std::string& what) {
  DTORCH_CHECK(static_cast<int>(out.size()) == size(), "allgather needs ", size(),
               " output tensors, got ", out.size());
  if (size() == 1) {
    out[0].copy_(in);
    return;
  }
  if (through_host(in)) {  // Note [CUDA tensors over Gloo]
    std::vector<at::Tensor> host;
    for (const auto& o : out)
      host.push_back(at::empty(o.sizes(), o.options().device(at::kCPU)));
    allgather(host, in.cpu(), what);
    for (size_t r = 0; r < out.size(); ++r)
      out[r].copy_(host[r]);
    return;
  }
  start(
      "allgather", what, in,
      [this, &out](at::Tensor& b) {
        std::vector<std::vector<at::Tensor>> outs{out};
        std::vector<at::Tensor> ins{b};
        return impl_->backend_for(b).allgather(outs, ins);
      },
      nullptr)
      .wait();
}

Work Communicator::isend(at::Tensor t, int dst, int tag) {
  if (through_host(t))
    return start_p2p("send", t.cpu(), dst, tag);  // Note [CUDA tensors over Gloo]
  return start_p2p("send", std::move(t), dst, tag);
}

Work Communicator::irecv(at::Tensor t, int src, int tag) {
  if (through_host(t)) {  // Note [CUDA tensors over Gloo]
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
    return then(start_p2p("recv", host, src, tag), [t, host]() mutable { t.copy_(host); });
  }
  return start_p2p("recv", std::move(t), src, tag);
}

void Communicator::send(at::Tensor t, int dst, int tag) {
  isend(std::move(t), dst, tag).wait();
}

void Communicator::recv(at::Tensor t, int src, int tag) {
  irecv(std::move(t), src, tag).wait();
}

void Communicator::all_to_all(std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in,
                              int tag) {
  const int n = size(), me = rank();
  DTORCH_CHECK(static_cast<int>(in.size()) == n && static_cast<int>(out.size()) == n,
               "all_to_all takes one tensor per rank (", n, "), got ", in.size(), " in and ",
               out.size(), " out");
  std::vector<Work> pending;
  // Receives first, then sends in ring order from the next rank, so that no two ranks send to
  // the same peer at once.
  for (int k = 1; k < n; ++k)
    pending.push_back(irecv(out[(me - k + n) % n], (me - k + n) % n, tag));
  for (int k = 1; k < n; ++k)
    pending.push_back(isend(in[(me + k) % n], (me + k) % n, tag));
  out[me].copy_(in[me]);
  for (Work& w : pending)
    w.wait();
}

void Communicator::barrier(const std::string& what) {
  at::Tensor none = at::empty({0});
  start(
      "barrier", what, none,
      [this](at::Tensor& b) { return impl_->backend_for(b).barrier(c10d::BarrierOptions()); },
      nullptr)
      .wait();
}

std::string Communicator::broadcast_string(const std::string& s, int root,
                                           const std::string& what) {
  if (size() == 1) return s;
  at::Tensor n = at::full({1}, static_cast<int64_t>(s.size()), at::kLong);
  broadcast(n, root, what + " length");
  if (n.item<int64_t>() == 0) return std::string();  // an empty tensor's data_ptr() is null
  at::Tensor bytes = at::empty({n.item<int64_t>()}, at::kByte);
  if (rank() == root) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  broadcast(bytes, root, what);
  return std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
}

void Communicator::fail(const std::string& op, long seq, const std::string& cause, int peer) {
  std::string diagnosis;
  try {
    impl_->root_store->setTimeout(kDiagnosisWindow);
    auto& store = *impl_->store;
    const std::string mine = op;
    // Also under a key without the number: a peer that had already moved on to the next
    // collective (or not reached this one) fails there, and is then not silent.
    if (!posted_within(impl_->store,
                       {{str("failed/", seq, "/", rank()), mine}, {str("failing/", rank()), mine}},
                       kStoreAnswers)) {
      impl_->store_silent = true;
      throw std::runtime_error(str("no answer within ", kStoreAnswers.count() / 1000.0, " s"));
    }
    std::vector<int> silent, left, failed, elsewhere, dead, stopped;
    auto deadline = Clock::now() + kDiagnosisWindow;
    for (;;) {
      silent.clear();
      left.clear();
      failed.clear();
      elsewhere.clear();
      dead.clear();
      stopped.clear();
      for (int r = 0; r < size(); ++r) {
        if (r == rank() || (peer >= 0 && r != peer)) continue;
        if (store.check({str("failed/", seq, "/", r)})) {
          failed.push_back(r);
        } else if (store.check({str("failing/", r)})) {
          elsewhere.push_back(r);
        } else if (store.check({str("left/", r)})) {
          left.push_back(r);
        } else {
          const LocalProcess here = local_process(store, r);
          (here == LocalProcess::Gone      ? dead
           : here == LocalProcess::Stopped ? stopped
                                           : silent)
              .push_back(r);
        }
      }
      if (silent.empty() || Clock::now() > deadline) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    auto join = [this](const std::vector<int>& v) {
      std::vector<std::string> names;
      for (int r : v)
        names.push_back(describe_rank(r));
      return dtorch::comm::join(names);
    };
    std::ostringstream os;
    if (!dead.empty()) {
      os << "rank(s) " << join(dead) << " died: their processes on this host are gone";
    }
    if (!stopped.empty()) {
      os << (dead.empty() ? "" : "; ") << "rank(s) " << join(stopped)
         << " are stopped (SIGSTOP or ^Z): their processes on this host are in state T";
    }
    if (!silent.empty()) {
      os << (dead.empty() && stopped.empty() ? "" : "; ") << "rank(s) " << join(silent)
         << " did not reach or did not finish this collective: "
         << "dead, stopped, or stuck in other work (look at their logs first)";
    }
    if (!left.empty()) {
      os << (os.tellp() > 0 ? "; " : "") << "rank(s) " << join(left)
         << " had already finished: they ran fewer collectives than this rank";
    }
    std::vector<std::string> disagree;
    for (int r : failed) {
      auto v = store.get(str("failed/", seq, "/", r));
      std::string theirs(v.begin(), v.end());
      if (theirs != mine) disagree.push_back(str("rank ", describe_rank(r), " was in ", theirs));
    }
    for (int r : elsewhere) {
      auto v = store.get(str("failing/", r));
      os << (os.tellp() > 0 ? "; " : "") << "rank " << describe_rank(r) << " failed in "
         << std::string(v.begin(), v.end());
    }
    for (const auto& d : disagree)
      os << (os.tellp() > 0 ? "; " : "") << d;
    if (!disagree.empty()) {
      os << " (every rank must issue the same collectives in the same order)";
    }
    if (os.tellp() == 0) {
      os << (peer >= 0 ? str("rank ", describe_rank(peer), " failed in it too")
                       : std::string("every other rank failed in the same collective"));
    }
    diagnosis = os.str();
  } catch (const std::exception& e) {
    diagnosis = str("the rendezvous store at ", info_.master_addr, ":", info_.master_port,
                    " is unreachable too (", first_line(e.what()), "): the process serving it ",
                    info_.launcher_hosts_store ? "(the launcher of node 0)" : "(rank 0)",
                    " has exited or is stopped");
  }
  DTORCH_FAIL(CommError, "rank ", describe_rank(rank()), ": ", op, " failed: ", first_line(cause),
              "\n  ", diagnosis, "\n---> HINT: a rank that is merely slow (long data loading, a ",
              "checkpoint) needs a longer timeout: DTORCH_TIMEOUT=<seconds> (now ",
              opts_.timeout.count() / 1000.0, " s)");
}

}  // namespace dtorch::comm
