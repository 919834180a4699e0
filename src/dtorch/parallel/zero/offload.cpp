// The optimizer's state in a file between its steps (Note [Optimizer state on disk] in
// offload.h): the file and its I/O thread, the host buffers the state passes through, and the
// step that goes shard by shard.
#include "dtorch/parallel/zero/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/core/ordered_thread.h"
#include "dtorch/core/storage.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/zero/offload_file.h"

namespace dtorch::zero {
namespace {

using offload_file::aligned;
using offload_file::move_bytes;
using offload_file::page_bytes;

// How long one read or write may take before the run ends naming it: a disk that answers
// nothing in this long has failed.
constexpr auto kIoTimeout = std::chrono::minutes(5);

// The file's bytes at `at` (whole pages) mapped into memory: what a state tensor holds when
// paged in (page_in_all). Dropped, its changes go back to the file before it is unmapped.
struct FileMapping {
  void* p;
  size_t n;
  size_t at;  // where in the file
};
void unmap_file(void* ctx) {
  std::unique_ptr<FileMapping> m(static_cast<FileMapping*>(ctx));
  ::msync(m->p, m->n, MS_SYNC);
  ::munmap(m->p, m->n);
}
// The mapping of the file `t` holds (page_in_all), or null.
const FileMapping* mapping_of(const at::Tensor& t) {
  if (!holds_storage(t) || t.storage().data_ptr().get_deleter() != &unmap_file) return nullptr;
  return static_cast<const FileMapping*>(t.storage().data_ptr().get_context());
}
bool maps_file(const at::Tensor& t) {
  return mapping_of(t) != nullptr;
}

}  // namespace

// Named, not anonymous: OptimizerOffload::Impl, declared in the header, holds these.
namespace offload_io {

// Host buffers of one size, page aligned, lent out as DataPtrs: a state tensor holds one while
// it is in memory, a write while it is in flight, and a buffer comes back to the pool when
// whoever holds it drops it. The mappings live as long as the last lease.
class BufferPool {
 public:
  BufferPool(int count, size_t bytes) : core_(std::make_shared<Core>()) {
    core_->bytes = bytes;
    for (int i = 0; i < count; ++i) {
      core_->mappings.push_back(map_memory(bytes));
      core_->free.push_back(core_->mappings.back().get());
    }
  }

  size_t free() const {
    std::lock_guard<std::mutex> l(core_->mu);
    return core_->free.size();
  }
  bool owns(const at::DataPtr& p) const {
    return p.get_deleter() == &give_back &&
           static_cast<const Lease*>(p.get_context())->core == core_;
  }
  /// A buffer, waiting for a write to return one when none is free.
  at::DataPtr take(const std::string& what) {
    std::unique_lock<std::mutex> l(core_->mu);
    const bool some = core_->cv.wait_for(l, kIoTimeout, [&] { return !core_->free.empty(); });
    DTORCH_CHECK_T(TrainingError, some, "optimizer offload: no host buffer came back from the ",
                   "disk in 5 minutes for ", what, "; the disk has stopped answering");
    void* p = core_->free.back();
    core_->free.pop_back();
    return at::DataPtr(p, new Lease{core_, p}, &give_back, at::kCPU);
  }

 private:
  struct Core {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::vector<void*> free;
    std::vector<at::DataPtr> mappings;
    size_t bytes = 0;
  };
  struct Lease {
    std::shared_ptr<Core> core;
    void* p;
  };
  static void give_back(void* ctx) {
    std::unique_ptr<Lease> lease(static_cast<Lease*>(ctx));
    {
      std::lock_guard<std::mutex> l(lease->core->mu);
      lease->core->free.push_back(lease->p);
    }
    lease->core->cv.notify_one();
  }
  std::shared_ptr<Core> core_;
};

// One read or write as the I/O thread leaves it: done, or failed with a message. (Not a
// std::future: its timed wait imports a libstdc++ symbol that LibTorch exports too, Note
// [libstdc++ symbols LibTorch exports] in core/paths.h.)
struct Transfer {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  void finish(std::string message) {
    {
      std::lock_guard<std::mutex> l(mu);
      error = std::move(message);
      done = true;
    }
    cv.notify_all();
  }
};
using Pending = std::shared_ptr<Transfer>;

// A run of one shard's elements that steps with its state in the pool's buffers: a shard
// steps in pieces of at most a buffer's size (Note [Optimizer state on disk]).
struct Piece {
  size_t k = 0;  // the shard
  int64_t begin = 0, size = 0;
  bool fresh = false;             // the file holds no state of the shard yet: the step makes it
  std::vector<at::Tensor> state;  // read from the file into buffers, one per state tensor
  std::vector<Pending> reads;
};

}  // namespace offload_io

namespace {

// Waits for one read or write, bounded, throwing its error.
void wait_io(const offload_io::Pending& t, const std::string& what) {
  std::unique_lock<std::mutex> l(t->mu);
  DTORCH_CHECK_T(TrainingError, t->cv.wait_for(l, kIoTimeout, [&] { return t->done; }),
                 "optimizer offload: ", what, " has not finished in 5 minutes; the disk has ",
                 "stopped answering");
  if (!t->error.empty()) throw TrainingError(t->error);
}

}  // namespace

struct OptimizerOffload::Impl {
  using BufferPool = offload_io::BufferPool;
  using Pending = offload_io::Pending;
  using Piece = offload_io::Piece;
  using Transfer = offload_io::Transfer;

  torch::optim::Optimizer& opt;
  std::vector<at::Tensor> params;
  OffloadOptions o;
  std::string path;
  int fd = -1;
  size_t per_param = 0;                          // state tensors the optimizer keeps per parameter
  std::vector<size_t> slot_bytes, first;         // per parameter: a slot's size, its first offset
  std::vector<std::pair<size_t, size_t>> place;  // per parameter: its group, its index there
  std::vector<bool> on_disk;                     // per parameter: the file holds its state
  std::vector<bool> written;  // per parameter: its slots hold more than the zeros they began with
  size_t file_size = 0, buffer_bytes = 0;
  std::unique_ptr<BufferPool> pool;
  std::deque<Pending> writing;  // every write not yet waited for
  OrderedThread io;             // last: destroyed first, finishing what it was given

  Impl(torch::optim::Optimizer& opt, std::vector<at::Tensor> params, OffloadOptions options)
      : opt(opt), params(std::move(params)), o(std::move(options)) {}

  torch::optim::OptimizerParamState* state_of(size_t k) {
    auto it = opt.state().find(compat::optimizer_state_key(params[k]));
    return it == opt.state().end() ? nullptr : it->second.get();
  }
  std::vector<at::Tensor> tensors_of(size_t k) {
    std::vector<at::Tensor> out;
    if (auto* s = state_of(k)) {
      for (auto& [name, t] : parallel::state_tensors(*s))
        out.push_back(t);
    }
    return out;
  }
  // Where element `begin` of shard k's state tensor i lies in the file.
  size_t offset(size_t k, size_t i, int64_t begin) const {
    return first[k] + i * slot_bytes[k] + static_cast<size_t>(begin) * params[k].element_size();
  }
  // Elements of shard k a piece holds: as many as fill a buffer.
  int64_t piece_elements(size_t k) const {
    return static_cast<int64_t>(buffer_bytes / params[k].element_size());
  }
  // Gives shard k a state like `like` whose tensors are the shard's size and hold no memory:
  // their bytes are in the file.
  void keep_on_disk(size_t k, const torch::optim::OptimizerParamState& like) {
    const at::Tensor& shard = params[k];
    opt.state()[compat::optimizer_state_key(shard)] =
        parallel::map_state(like, [&](const at::Tensor& t) {
          // Shaped as the shard without ever holding its bytes: an allocation of the shard's
          // size, freed at once, would stay in the heap (Note [Returning released memory]).
          at::Tensor out = at::empty({0}, t.options());
          out.unsafeGetTensorImpl()->set_sizes_contiguous(shard.sizes());
          return out;
        });
  }
  std::string where(size_t k, size_t i, int64_t begin) const {
    return str("optimizer state tensor ", i, " of shard ", k, " (byte ", offset(k, i, begin),
               " of ", path, ")");
  }

  void open_file();
  std::vector<Piece> plan(const std::vector<at::Tensor>& grads) const;
  Pending transfer(bool write, size_t at, size_t n, void* data, std::shared_ptr<at::DataPtr> hold,
                   std::string what);
  void read(Piece& p);
  void write(size_t k, size_t i, int64_t begin, const void* src, size_t nbytes,
             at::DataPtr memory = {});
  void spill(size_t k);
  void step_piece(Piece& p, const at::Tensor& grad, bool last);
  void finish_writes();
};

void OptimizerOffload::Impl::open_file() {
  offload_file::Made made =
      offload_file::make(o.dir, o.name, file_size, /*direct=*/true, "this rank's optimizer state");
  fd = made.fd;
  path = std::move(made.path);
}

// The shards with gradients, in pieces of at most a buffer: a buffer holds whole pages of
// elements, so each piece's slice of a slot starts on a page (Note [Optimizer state on disk]).
std::vector<offload_io::Piece> OptimizerOffload::Impl::plan(
    const std::vector<at::Tensor>& grads) const {
  std::vector<Piece> out;
  for (size_t k = 0; k < params.size(); ++k) {
    if (!grads[k].defined()) continue;
    const int64_t n = params[k].numel();
    const int64_t most = piece_elements(k);
    for (int64_t begin = 0; begin < n || begin == 0; begin += most) {
      Piece p;
      p.k = k;
      p.begin = begin;
      p.size = std::min(most, n - begin);
      p.fresh = !on_disk[k];
      out.push_back(std::move(p));
    }
  }
  return out;
}

offload_io::Pending OptimizerOffload::Impl::transfer(bool write, size_t at, size_t n, void* data,
                                                     std::shared_ptr<at::DataPtr> hold,
                                                     std::string what) {
  auto t = std::make_shared<Transfer>();
  io.submit([fd = fd, write, data, n, at, hold, t, what = std::move(what)]() mutable {
    // The buffer goes back to the pool as the transfer ends, before anyone hears it has.
    std::shared_ptr<at::DataPtr> buffer = std::move(hold);
    std::string error = move_bytes(fd, write, static_cast<char*>(data), n, at);
    if (!error.empty())
      error = str("optimizer offload: ", write ? "writing " : "reading ", what, " failed: ", error);
    buffer.reset();
    t->finish(std::move(error));
  });
  return t;
}

// Starts reading piece p's state from the file into buffers, one per state tensor.
void OptimizerOffload::Impl::read(Piece& p) {
  if (p.fresh || !p.state.empty()) return;
  const std::vector<at::Tensor> whole = tensors_of(p.k);
  const size_t nbytes = static_cast<size_t>(p.size) * params[p.k].element_size();
  for (size_t i = 0; i < whole.size(); ++i) {
    at::Tensor t = at::empty({0}, whole[i].options());
    at::DataPtr memory = pool->take(where(p.k, i, p.begin));
    void* data = memory.get();
    t.set_(c10::Storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(buffer_bytes),
                        std::move(memory), nullptr, false),
           0, {p.size}, {1});
    p.state.push_back(t);
    p.reads.push_back(transfer(/*write=*/false, offset(p.k, i, p.begin), aligned(nbytes), data,
                               nullptr, where(p.k, i, p.begin)));
  }
}

// Starts writing `nbytes` from `src` to shard k's state tensor i at element `begin`: from
// `memory` itself when it is a buffer of the pool holding them, else from a copy in one.
void OptimizerOffload::Impl::write(size_t k, size_t i, int64_t begin, const void* src,
                                   size_t nbytes, at::DataPtr memory) {
  if (!memory || !pool->owns(memory)) {
    at::DataPtr buffer = pool->take(where(k, i, begin));
    std::memcpy(buffer.get(), src, nbytes);
    memory = std::move(buffer);  // frees `src` when it was `memory`'s
  }
  void* data = memory.get();
  written[k] = true;
  writing.push_back(transfer(/*write=*/true, offset(k, i, begin), aligned(nbytes), data,
                             std::make_shared<at::DataPtr>(std::move(memory)), where(k, i, begin)));
}

// Shard k's whole state, if in memory, goes to the file and gives its memory back: state of
// its own (a checkpoint loaded into new tensors) is written; state mapped from the file
// (page_in_all) is there already, and goes back to it as it is unmapped.
void OptimizerOffload::Impl::spill(size_t k) {
  if (!state_of(k)) {
    on_disk[k] = false;  // its state was taken away: the next step makes it anew
    return;
  }
  const std::vector<at::Tensor> whole = tensors_of(k);
  const int64_t most = piece_elements(k);
  bool in_memory = false;
  for (size_t i = 0; i < whole.size(); ++i) {
    const at::Tensor& t = whole[i];
    if (!holds_storage(t)) continue;
    in_memory = true;
    if (maps_file(t)) continue;
    DTORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.numel() == params[k].numel() &&
                     t.scalar_type() == params[k].scalar_type(),
                 "optimizer offload: shard ", k, "'s state is not shaped as the shard");
    for (int64_t begin = 0; begin < t.numel(); begin += most) {
      const at::Tensor slice = t.narrow(0, begin, std::min(most, t.numel() - begin));
      write(k, i, begin, slice.data_ptr(), slice.nbytes());
    }
  }
  if (!in_memory) return;
  for (const auto& t : whole)
    release_storage(t);
  on_disk[k] = true;
}

// Steps piece p: the optimizer sees a view of the shard's elements, with the slices of its
// state (or, fresh, makes them), and the slices go to the file after. Every piece starts from
// the shard's step count; the `last` one of the shard gives it the next.
void OptimizerOffload::Impl::step_piece(Piece& p, const at::Tensor& grad, bool last) {
  for (const auto& r : p.reads)
    wait_io(r, "reading " + where(p.k, 0, p.begin));
  p.reads.clear();
  const at::Tensor& shard = params[p.k];
  at::Tensor view = shard.narrow(0, p.begin, p.size);
  view.mutable_grad() = grad.narrow(0, p.begin, p.size);
  const auto key = compat::optimizer_state_key(view);
  torch::optim::OptimizerParamState* whole = state_of(p.k);
  if (!p.fresh) {
    const auto named = parallel::state_tensors(*whole);
    opt.state()[key] = parallel::map_state(*whole, [&](const at::Tensor& t) {
      size_t i = 0;
      while (i < named.size() && !named[i].second.is_same(t))
        ++i;
      DTORCH_CHECK(i < named.size(), "optimizer offload: shard ", p.k,
                   "'s state has a tensor it did not list");
      return p.state[i];
    });
  }
  at::Tensor& slot = opt.param_groups()[place[p.k].first].params()[place[p.k].second];
  struct Put {
    at::Tensor& slot;
    const at::Tensor& shard;
    ~Put() { slot = shard; }
  } put{slot, shard};
  slot = view;
  opt.step();
  auto it = opt.state().find(key);
  if (it == opt.state().end()) return;  // SGD without momentum keeps none
  std::unique_ptr<torch::optim::OptimizerParamState> made = std::move(it->second);
  opt.state().erase(it);
  if (!whole) {
    keep_on_disk(p.k, *made);  // the shard's own state, its bytes written below
  } else if (last) {
    parallel::set_steps(*whole, parallel::steps_of(*made));
  }
  const auto named = parallel::state_tensors(*made);
  for (size_t i = 0; i < named.size(); ++i) {
    const at::Tensor& t = named[i].second;
    const size_t nbytes = t.nbytes();
    const void* src = t.data_ptr();
    write(p.k, i, p.begin, src, nbytes, release_storage(t));
  }
  p.state.clear();
}

void OptimizerOffload::Impl::finish_writes() {
  while (!writing.empty()) {
    Pending f = writing.front();
    writing.pop_front();
    wait_io(f, "writing the optimizer state to " + path);
  }
}

OptimizerOffload::OptimizerOffload(torch::optim::Optimizer& opt, std::vector<at::Tensor> params,
                                   OffloadOptions options)
    : impl_(std::make_unique<Impl>(opt, std::move(params), std::move(options))) {
  Impl& m = *impl_;
  // The state tensors a parameter steps with, as the optimizer makes them (Note [Fused
  // optimizers]): Adam's two moments (three with amsgrad), SGD's momentum (none without).
  if (auto probe = parallel::fresh_state(opt, at::zeros({1})))
    m.per_param = parallel::state_tensors(*probe).size();
  DTORCH_CHECK_T(ConfigError, m.o.buffers >= static_cast<int>(m.per_param) && m.o.buffers >= 1,
                 "--offload-buffers ", m.o.buffers, " is too few: the optimizer steps each piece ",
                 "of a shard with its ", m.per_param, " state tensors in memory at once; give at ",
                 "least ", std::max<size_t>(m.per_param, 1));
  DTORCH_CHECK_T(ConfigError, m.o.buffer_bytes >= page_bytes(), "an offload buffer of ",
                 m.o.buffer_bytes, " bytes is too small: give at least ", page_bytes());
  size_t largest = page_bytes();
  for (const auto& p : m.params) {
    DTORCH_CHECK(p.dim() == 1, "optimizer offload takes flat (1-D) parameters");
    m.slot_bytes.push_back(aligned(p.nbytes()));
    m.first.push_back(m.file_size);
    m.file_size += m.per_param * m.slot_bytes.back();
    largest = std::max(largest, m.slot_bytes.back());
  }
  // Whole pages, no larger than the largest slot needs.
  m.buffer_bytes = std::min(m.o.buffer_bytes / page_bytes() * page_bytes(), largest);
  m.on_disk.assign(m.params.size(), false);
  m.written.assign(m.params.size(), false);
  for (size_t k = 0; k < m.params.size(); ++k) {
    bool found = false;
    auto& groups = opt.param_groups();
    for (size_t g = 0; g < groups.size() && !found; ++g) {
      for (size_t i = 0; i < groups[g].params().size() && !found; ++i) {
        if (groups[g].params()[i].is_same(m.params[k])) {
          m.place.emplace_back(g, i);
          found = true;
        }
      }
    }
    DTORCH_CHECK(found, "optimizer offload: shard ", k, " is not a parameter of the optimizer");
  }
  m.open_file();
  m.pool = std::make_unique<offload_io::BufferPool>(m.o.buffers, m.buffer_bytes);
}

OptimizerOffload::~OptimizerOffload() {
  Impl& m = *impl_;
  try {
    m.finish_writes();
  } catch (const std::exception&) {
    // The run ends with the error that stopped it; the file goes with the descriptor.
  }
  if (m.fd >= 0) {
    // Nothing the thread was given may use the descriptor after this.
    auto last = std::make_shared<offload_io::Transfer>();
    m.io.submit([last] { last->finish(""); });
    try {
      wait_io(last, "the last transfer to " + m.path);
    } catch (const std::exception&) {
    }
    ::close(m.fd);
  }
}

void OptimizerOffload::step(const at::Tensor& found_inf,
                            const std::function<void(size_t)>& stepped) {
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  m.finish_writes();
  // Each piece steps alone (Note [Steps a part at a time]).
  const optim::HiddenGradients hidden(m.params);
  const std::vector<at::Tensor>& grads = hidden.grads();
  if (optim::skipped_over_nothing(m.opt, found_inf)) return;
  for (size_t k = 0; k < m.params.size(); ++k)
    m.spill(k);
  // Adam's first step from zero moments is the step it makes from no state (SGD's momentum
  // starts as the first gradient, undamped): there a shard's first step reads the zeros its slots
  // hold until written, so its state is made in the pool's buffers rather than allocated piece by
  // piece and copied there. Pieces of many sizes left as many freed buffers in the heap (Note
  // [Returning released memory]): gpt-small's ZeRO-1 shard at 2 ranks, 0.07 GiB of them.
  if (dynamic_cast<torch::optim::Adam*>(&m.opt) || dynamic_cast<torch::optim::AdamW*>(&m.opt))
    init_state();
  std::vector<offload_io::Piece> pieces = m.plan(grads);
  for (size_t j = 0; j < pieces.size(); ++j) {
    offload_io::Piece& p = pieces[j];
    m.read(p);
    // The next piece is read while this one steps, when buffers are free for it besides those
    // this piece's write takes if its state is not in buffers yet.
    const size_t reserve = p.fresh ? m.per_param : 0;
    if (j + 1 < pieces.size() && m.pool->free() >= m.per_param + reserve) m.read(pieces[j + 1]);
    const bool last = j + 1 == pieces.size() || pieces[j + 1].k != p.k;
    m.step_piece(p, grads[p.k], last);
    if (!last) continue;
    m.on_disk[p.k] = true;
    if (stepped) stepped(p.k);
  }
  // What the optimizer recorded for a skipped step's undo points at the pieces' states; a step
  // over no gradients clears it.
  m.opt.step();
}

void OptimizerOffload::page_in_all() {
  Impl& m = *impl_;
  m.finish_writes();
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (!m.on_disk[k] || m.slot_bytes[k] == 0) continue;
    std::vector<at::Tensor> ts = m.tensors_of(k);
    for (size_t i = 0; i < ts.size(); ++i) {
      if (holds_storage(ts[i])) continue;
      const size_t n = m.slot_bytes[k];
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd,
                       static_cast<off_t>(m.offset(k, i, 0)));
      DTORCH_CHECK_T(TrainingError, p != MAP_FAILED, "optimizer offload: cannot map ",
                     m.where(k, i, 0), " into memory: ", std::strerror(errno));
      restore_storage(
          ts[i], ts[i].nbytes(),
          at::DataPtr(p, new FileMapping{p, n, m.offset(k, i, 0)}, &unmap_file, at::kCPU));
    }
  }
}

std::function<at::Tensor(const at::Tensor&)> OptimizerOffload::snapshot() {
  Impl& m = *impl_;
  m.finish_writes();
  // What the mappings changed goes to the file first: an O_DIRECT read passes the page cache.
  for (size_t k = 0; k < m.params.size(); ++k)
    for (const at::Tensor& t : m.tensors_of(k))
      if (const FileMapping* f = mapping_of(t)) ::msync(f->p, f->n, MS_SYNC);
  if (m.file_size == 0) return [](const at::Tensor&) { return at::Tensor(); };
  const std::shared_ptr<char> kept =
      offload_file::copy_and_map(m.fd, m.file_size, m.path, m.o.dir, "optimizer offload");
  return [kept](const at::Tensor& t) {
    const FileMapping* f = mapping_of(t);
    if (!f) return at::Tensor();
    char* same = kept.get() + f->at + (static_cast<char*>(t.data_ptr()) - static_cast<char*>(f->p));
    return torch::from_blob(
        same, t.sizes(), t.strides(), [kept](void*) {}, t.options());
  };
}

void OptimizerOffload::init_state() {
  Impl& m = *impl_;
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (m.state_of(k) || m.written[k]) continue;
    auto fresh = parallel::fresh_state(m.opt, at::zeros({1}, m.params[k].options()));
    if (!fresh) return;  // an optimizer without state
    m.keep_on_disk(k, *fresh);
    m.on_disk[k] = true;
  }
}

int64_t OptimizerOffload::swapped_bytes() const {
  int64_t bytes = 0;
  for (size_t k = 0; k < impl_->params.size(); ++k) {
    for (const auto& t : impl_->tensors_of(k))
      bytes += holds_storage(t) ? 0 : static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

int64_t OptimizerOffload::file_bytes() const {
  return static_cast<int64_t>(impl_->file_size);
}

int64_t OptimizerOffload::buffer_bytes() const {
  return static_cast<int64_t>(impl_->buffer_bytes);
}

const std::string& OptimizerOffload::path() const {
  return impl_->path;
}

}  // namespace dtorch::zero
