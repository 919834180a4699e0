// Communicator: the one API through which every collective in dtorch runs, for the whole job
// or for a process group split from it (Note [Process groups]). Gloo carries CPU tensors,
// NCCL (where compiled) CUDA tensors; rendezvous goes through a TCPStore. A failed or
// timed-out collective throws CommError naming the operation and the ranks that did not take
// part, never hangs silently. See Note [Failure diagnosis] in communicator_diagnosis.cpp.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtorch/launch/rank_info.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace dtorch::comm {

enum class ReduceOp { Sum, Avg, Max, Min };

struct CommOptions {
  /// How long one collective, or the rendezvous, may wait for peers before failing with a
  /// message naming the missing ranks. DTORCH_TIMEOUT (seconds) overrides; default 300 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// "auto" (Gloo for CPU tensors, plus NCCL for CUDA tensors where compiled), "gloo" or
  /// "nccl". DTORCH_BACKEND overrides.
  std::string backend = "auto";
  /// Reduce-scatter and flat allgather over Gloo (across nodes, or with DTORCH_SHM=0):
  /// "auto" (the faster measured on this LibTorch, Note [Gloo on 2.x]), "native" (Gloo's own;
  /// LibTorch 2.x only) or "dtorch" (dtorch's ring and per-chunk allgather).
  /// DTORCH_GLOO_COLLECTIVES overrides.
  std::string gloo_collectives = "auto";
};

/// CommOptions with DTORCH_TIMEOUT, DTORCH_BACKEND and DTORCH_GLOO_COLLECTIVES applied.
CommOptions comm_options_from_env();

/// The backends this build of dtorch can create: "gloo", plus "nccl" when built against a
/// LibTorch with CUDA and NCCL (whether a GPU is present or not).
std::vector<std::string> compiled_backends();

class Communicator;

/// Bytes this rank sent in collectives, by kind, counted as a bandwidth-optimal ring sends
/// them (allreduce 2(N-1)/N of the tensor, reduce-scatter (N-1)/N of the input, allgather
/// (N-1)/N of the output, broadcast and send the tensor once): the volumes the ZeRO paper's
/// accounting uses. See Note [Reduce-scatter on Gloo] in communicator_collectives.cpp.
struct Traffic {
  int64_t allreduce = 0;
  int64_t reduce_scatter = 0;
  int64_t allgather = 0;
  int64_t broadcast = 0;
  int64_t send = 0;
  /// Of total(): the bytes sent to a rank on another node (Note [Traffic across nodes]).
  int64_t cross_node = 0;
  int64_t total() const { return allreduce + reduce_scatter + allgather + broadcast + send; }
  int64_t within_node() const { return total() - cross_node; }
  Traffic& operator+=(const Traffic& o) {
    allreduce += o.allreduce;
    reduce_scatter += o.reduce_scatter;
    allgather += o.allgather;
    broadcast += o.broadcast;
    send += o.send;
    cross_node += o.cross_node;
    return *this;
  }
};

/// Handle to an asynchronous collective. wait() blocks until the result is in the tensor
/// given to the call (averaging and dtype casts done), and throws CommError on failure.
class Work {
 public:
  Work() = default;
  void wait();
  /// True once wait() would return without blocking.
  bool completed() const;
  /// Whether this handle refers to an operation (a default-constructed one does not).
  bool valid() const { return state_ != nullptr; }

 private:
  friend class Communicator;
  struct State;
  std::shared_ptr<State> state_;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  /// Joins the job described by `info`: connects to (or serves) the store, waits for every
  /// rank, and creates the process groups. World size 1 creates nothing and every collective
  /// is a local no-op.
  static std::shared_ptr<Communicator> create(const launch::RankInfo& info,
                                              const CommOptions& opts = comm_options_from_env());
  /// create() with the rank read from torchrun's environment.
  static std::shared_ptr<Communicator> from_env(const CommOptions& opts = comm_options_from_env());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This process's rank in this communicator (its group rank for a split one), and the
  /// number of ranks in it.
  int rank() const { return info_.rank; }
  int size() const { return info_.world_size; }
  /// The job as this communicator sees it: for a split one, rank, world_size, local_rank and
  /// local_world_size count its members only; node_rank and the rendezvous are the job's.
  const launch::RankInfo& info() const { return info_; }
  /// The job-wide rank of this communicator's rank r (r itself for the whole job).
  int global_rank(int r) const;
  int global_rank() const { return global_rank(rank()); }
  /// The name given to split(); empty for the whole job.
  const std::string& group_name() const;
  /// "3" for the whole job, "3 (tp rank 1)" for rank 1 of group "tp": how errors name ranks.
  std::string describe_rank(int r) const;
  /// The launcher's node_rank of rank r, as r announced it at the rendezvous: which ranks
  /// share a node.
  int node_of(int r) const;

  /// Whether collectives of CPU tensors go through shared memory (Note [Shared-memory
  /// allreduce]): all ranks on one node and DTORCH_SHM not 0.
  bool uses_shared_memory() const;

  /// Note [Process groups]: a communicator over `ranks` (this communicator's numbering;
  /// this process's rank must be among them), which become ranks 0..n-1 in that order. Every
  /// member calls split with the same ranks and name, in the same order relative to its other
  /// splits; non-members do not call it. The group has the full API below, its own
  /// rendezvous namespace, operation sequence, traffic counters and failure diagnosis, and
  /// uses shared memory when its members share a node (even if the job spans nodes), Gloo
  /// otherwise.
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks, const std::string& name);
  const CommOptions& options() const { return opts_; }

  /// In-place allreduce of a contiguous tensor. `what` names the operation in errors.
  Work allreduce_async(at::Tensor t, ReduceOp op = ReduceOp::Sum, const std::string& what = "");
  void allreduce(at::Tensor t, ReduceOp op = ReduceOp::Sum, const std::string& what = "");
  /// In-place broadcast of `t` from `root` to every rank.
  Work broadcast_async(at::Tensor t, int root, const std::string& what = "");
  void broadcast(at::Tensor t, int root, const std::string& what = "");
  /// Reduce-scatter: rank r receives into `out` the sum (or average) over ranks of their
  /// in[r*n, (r+1)*n), n = out.numel(); in.numel() must be size()*n. `in` is used as scratch
  /// and holds garbage afterwards; `out` may alias in's chunk r. Each rank sends (N-1)/N of
  /// `in`, as a real reduce-scatter does (Gloo in LibTorch 1.13 has none: Note
  /// [Reduce-scatter on Gloo]).
  Work reduce_scatter_async(at::Tensor in, at::Tensor out, ReduceOp op = ReduceOp::Sum,
                            const std::string& what = "");
  void reduce_scatter(at::Tensor in, at::Tensor out, ReduceOp op = ReduceOp::Sum,
                      const std::string& what = "");
  /// Allgather into one flat tensor: out[r*n, (r+1)*n) receives rank r's `in` (n =
  /// in.numel(), out.numel() == size()*n, both contiguous). `in` may alias out's chunk r.
  Work allgather_into_async(at::Tensor out, at::Tensor in, const std::string& what = "");
  void allgather_into(at::Tensor out, at::Tensor in, const std::string& what = "");
  /// out[r] receives rank r's `in`; out must hold size() tensors shaped like `in`.
  void allgather(std::vector<at::Tensor>& out, const at::Tensor& in, const std::string& what = "");
  /// Point-to-point: sends contiguous `t` to rank `dst` / receives into `t` from rank `src`;
  /// the handle's wait() returns once `t` may be reused / holds the message. Messages between
  /// one pair with one tag arrive in the order sent; tags are 0 .. kMaxTag. Point-to-point
  /// takes no number from the collective sequence, so ranks may send different numbers of
  /// messages between collectives (Note [Reduce-scatter on Gloo]).
  Work isend(at::Tensor t, int dst, int tag = 0);
  Work irecv(at::Tensor t, int src, int tag = 0);
  void send(at::Tensor t, int dst, int tag = 0);
  void recv(at::Tensor t, int src, int tag = 0);
  static constexpr int kMaxTag = (1 << 28) - 1;
  /// out[r] receives rank r's in[rank()]: every rank sends in[j] to rank j (DeepSpeed
  /// Ulysses' all-to-all). in and out hold size() contiguous tensors, out[r] shaped like rank
  /// r's in[rank()]. Made of point-to-point messages on `tag`, so the bytes count as sends;
  /// returns once every message has arrived.
  void all_to_all(std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in, int tag = 0);
  void barrier(const std::string& what = "");

  /// Broadcasts a byte string from `root`; every rank returns root's value.
  std::string broadcast_string(const std::string& s, int root, const std::string& what = "");

  /// The rendezvous store, namespaced to this job and restart attempt.
  c10d::Store& store();

  /// Bytes sent so far (see Traffic); reset_traffic() starts counting again.
  Traffic traffic() const;
  void reset_traffic();

 private:
  struct Impl;
  Communicator(launch::RankInfo info, CommOptions opts);
  /// Issues a backend operation; peer >= 0 marks point-to-point with that rank, which takes
  /// no collective sequence number and whose failure diagnosis looks at the peer only.
  Work start(const std::string& op, const std::string& what, at::Tensor t,
             const std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor&)>& launch,
             std::function<void()> finish, const char* path = "", int peer = -1);
  /// Whether `t` is a CUDA tensor that must travel through host memory (Note [CUDA tensors
  /// over Gloo] in communicator_collectives.cpp).
  bool through_host(const at::Tensor& t) const;
  /// `w`, which also runs `finish` once it has completed.
  static Work then(Work w, std::function<void()> finish);
  /// Whether a reduce-scatter or flat allgather of `t` goes through the backend's own
  /// collective rather than dtorch's (Note [Gloo on 2.x]).
  bool native_collective(const at::Tensor& t) const;
  /// numbered false (point-to-point): seq 0, the collective sequence left alone.
  Work new_work(const std::string& op, const std::string& what, const at::Tensor& t,
                std::function<void()> finish, const char* path, bool numbered = true);
  /// isend/irecv: checks, traffic, then start() as point-to-point.
  Work start_p2p(const std::string& op, at::Tensor t, int peer, int tag);
  /// Rendezvous of this communicator's ranks on `store`, then its backends.
  void connect(c10::intrusive_ptr<c10d::Store> store);
  /// Runs `job` on the communicator's ordered thread: shared-memory collectives (Note
  /// [Shared-memory allreduce]) and the ring reduce-scatter, which are several steps each.
  Work start_local(const std::string& op, const std::string& what, const at::Tensor& t,
                   std::function<void(long seq)> job, std::function<void()> finish,
                   const char* path);
  /// Counts `bytes` of `kind` sent to rank `to`; -1: to this rank's successor in the ring.
  void count(int64_t Traffic::*kind, int64_t bytes, int to = -1);
  void setup_shared_memory();
  /// Throws CommError for `op` (sequence number `seq`, 0 for point-to-point), with the
  /// diagnosis of Note [Failure diagnosis] over `peer` only, or every rank when peer < 0.
  [[noreturn]] void fail(const std::string& op, long seq, const std::string& cause, int peer = -1);
  friend class Work;

  launch::RankInfo info_;
  CommOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtorch::comm
