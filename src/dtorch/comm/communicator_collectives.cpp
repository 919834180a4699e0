// Communicator collectives: how an operation is numbered, issued and waited for (Work), and
// every collective and point-to-point message dtorch sends, on NCCL, Gloo, shared memory or
// dtorch's own ring.
#include <cstring>
#include <future>
#include <sstream>

#include "dtorch/comm/backend_compat.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/comm/communicator_internal.h"
#include "dtorch/comm/shm_allreduce.h"
#include "dtorch/core/trace_range.h"

namespace dtorch::comm {
namespace {

using detail::describe;

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

}  // namespace

namespace detail {

std::string describe(const at::Tensor& t) {
  double mb = static_cast<double>(t.numel() * t.element_size()) / (1024.0 * 1024.0);
  std::ostringstream os;
  os.precision(3);
  os << t.numel() << " x " << t.scalar_type() << ", " << mb << " MiB";
  return os.str();
}

}  // namespace detail

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
  if (sending) count(&Traffic::send, nbytes(t), peer);
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

// Note [Traffic across nodes]
// On a cluster the links between nodes are an order of magnitude slower than those within one,
// so Traffic counts apart the bytes a rank sends to another node. A collective's bytes are
// counted as the ring that Traffic's volumes assume sends them: each rank to the next in the
// communicator's order (the last to the first), so they cross nodes where that next rank is on
// another node (node_of, as the launcher gave it). A launcher numbers a node's ranks
// consecutively, so a ring over n nodes crosses n links, each carrying one rank's share: as
// NCCL's rings, which enter and leave each node once. A point-to-point message crosses when its
// peer is elsewhere.
void Communicator::count(int64_t Traffic::*kind, int64_t bytes, int to) {
  if (to < 0) to = (rank() + 1) % size();
  const bool across = node_of(to) != node_of(rank());
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->traffic.*kind += bytes;
  if (across) impl_->traffic.cross_node += bytes;
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

}  // namespace dtorch::comm
