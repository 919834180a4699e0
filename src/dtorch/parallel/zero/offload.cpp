// The optimizer's state in a file between its steps (Note [Optimizer state on disk] in
// offload.h): the file and its I/O thread, the host buffers the state passes through, and the
// step that goes shard by shard.
#include "dtorch/parallel/zero/offload.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/core/ordered_thread.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/storage.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/optimizer_state.h"

namespace dtorch::zero {
namespace {

constexpr size_t kAlign = 4096;  // O_DIRECT's alignment of offsets, lengths and addresses
// How long one read or write may take before the run ends naming it: a disk that answers
// nothing in this long has failed.
constexpr auto kIoTimeout = std::chrono::minutes(5);

size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

std::string gib(uint64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << bytes / double(uint64_t{1} << 30) << " GiB";
  return os.str();
}

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

// Waits for one read or write, bounded, throwing its error.
void wait_io(const Pending& t, const std::string& what) {
  std::unique_lock<std::mutex> l(t->mu);
  DTORCH_CHECK_T(TrainingError, t->cv.wait_for(l, kIoTimeout, [&] { return t->done; }),
                 "optimizer offload: ", what, " has not finished in 5 minutes; the disk has ",
                 "stopped answering");
  if (!t->error.empty()) throw TrainingError(t->error);
}

}  // namespace

struct OptimizerOffload::Impl {
  torch::optim::Optimizer& opt;
  std::vector<at::Tensor> params;
  OffloadOptions o;
  std::string path;
  int fd = -1;
  size_t per_param = 0;                   // state tensors the optimizer keeps per parameter
  std::vector<size_t> slot_bytes, first;  // per parameter: a slot's size, its first offset
  size_t file_size = 0;
  std::unique_ptr<BufferPool> pool;
  // In flight on the I/O thread: reads by parameter, and every write not yet waited for.
  std::map<size_t, std::vector<Pending>> reading;
  std::deque<Pending> writing;
  OrderedThread io;  // last: destroyed first, finishing what it was given

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
  std::string where(size_t k, size_t i) const {
    return str("optimizer state tensor ", i, " of shard ", k, " (byte ",
               first[k] + i * slot_bytes[k], " of ", path, ")");
  }

  void open_file();
  Pending transfer(bool write, size_t k, size_t i, void* data, std::shared_ptr<at::DataPtr> hold);
  void read_into(size_t k, size_t i, const at::Tensor& t, at::DataPtr memory);
  bool read_ahead(size_t k, size_t reserve);
  void bring_in(size_t k);
  void write_out(size_t k);
  void finish_writes();
};

void OptimizerOffload::Impl::open_file() {
  DTORCH_CHECK_T(ConfigError, paths::is_directory(o.dir), "the offload folder ", o.dir,
                 " does not exist (--offload-dir, or ds_config's nvme_path): create it on a fast ",
                 "local disk, or name another");
  path = paths::join(o.dir, o.name);
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags, 0600);  // tmpfs: no O_DIRECT
  DTORCH_CHECK_T(ConfigError, fd >= 0, "cannot make the optimizer's offload file ", path, ": ",
                 std::strerror(errno), "; give --offload-dir a folder this user may write to");
  ::unlink(path.c_str());  // Note [Optimizer state on disk]: it goes when the run does
  struct statvfs fs {};
  const uint64_t available =
      ::statvfs(o.dir.c_str(), &fs) == 0 ? uint64_t{fs.f_bavail} * fs.f_frsize : 0;
  // fallocate, not posix_fallocate: where the filesystem cannot reserve space, glibc's
  // emulation would write the whole file, and fill the disk before it failed.
  int err = 0;
  if (file_size && ::fallocate(fd, 0, 0, static_cast<off_t>(file_size)) != 0) err = errno;
  if (err == EOPNOTSUPP) {
    err = available >= file_size ? 0 : ENOSPC;  // the free space now, then
    if (err == 0 && ::ftruncate(fd, static_cast<off_t>(file_size)) != 0) err = errno;
  }
  if (err == 0) return;
  ::close(fd);
  fd = -1;
  DTORCH_CHECK_T(ConfigError, err != ENOSPC && err != EFBIG, "the offload folder ", o.dir, " has ",
                 available, " bytes (", gib(available), ") free, and this rank's optimizer state ",
                 "needs ", file_size, " (", gib(file_size), "): free space there, or give ",
                 "--offload-dir a larger disk");
  DTORCH_FAIL(ConfigError, "cannot reserve ", file_size, " bytes for the optimizer's offload file ",
              path, ": ", std::strerror(err));
}

Pending OptimizerOffload::Impl::transfer(bool write, size_t k, size_t i, void* data,
                                         std::shared_ptr<at::DataPtr> hold) {
  const size_t n = slot_bytes[k];
  const off_t at = static_cast<off_t>(first[k] + i * n);
  auto t = std::make_shared<Transfer>();
  io.submit([fd = fd, write, data, n, at, hold, t, what = where(k, i)]() mutable {
    // The buffer goes back to the pool as the transfer ends, before anyone hears it has.
    std::shared_ptr<at::DataPtr> buffer = std::move(hold);
    std::string error;
    for (size_t done = 0; done < n && error.empty();) {
      char* p = static_cast<char*>(data) + done;
      const ssize_t r = write ? ::pwrite(fd, p, n - done, at + static_cast<off_t>(done))
                              : ::pread(fd, p, n - done, at + static_cast<off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) {
        done += static_cast<size_t>(r);
      } else {
        error = str("optimizer offload: ", write ? "writing " : "reading ", what,
                    " failed: ", r < 0 ? std::strerror(errno) : "the file ended");
      }
    }
    buffer.reset();
    t->finish(std::move(error));
  });
  return t;
}

// Gives `t` `memory` (a slot's size at least, page aligned) and starts reading its slot into it.
void OptimizerOffload::Impl::read_into(size_t k, size_t i, const at::Tensor& t,
                                       at::DataPtr memory) {
  void* data = memory.get();
  restore_storage(t, t.nbytes(), std::move(memory));
  reading[k].push_back(transfer(/*write=*/false, k, i, data, nullptr));
}

// Starts reading parameter k's state into free buffers, if it is on disk and `reserve` buffers
// stay free besides (the current parameter's write may need them). Whether it started.
bool OptimizerOffload::Impl::read_ahead(size_t k, size_t reserve) {
  if (reading.count(k)) return true;
  std::vector<at::Tensor> ts = tensors_of(k);
  size_t out = 0;
  for (const auto& t : ts)
    out += holds_storage(t) ? 0 : 1;
  if (out == 0 || pool->free() < out + reserve) return false;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!holds_storage(ts[i])) read_into(k, i, ts[i], pool->take(where(k, i)));
  }
  return true;
}

// Parameter k's state in memory (if it has any yet): its reads waited for, or made now.
void OptimizerOffload::Impl::bring_in(size_t k) {
  if (!reading.count(k)) {
    std::vector<at::Tensor> ts = tensors_of(k);
    for (size_t i = 0; i < ts.size(); ++i) {
      if (!holds_storage(ts[i])) read_into(k, i, ts[i], pool->take(where(k, i)));
    }
  }
  auto it = reading.find(k);
  if (it == reading.end()) return;
  const std::vector<Pending> reads = std::move(it->second);
  reading.erase(it);
  for (const auto& f : reads)
    wait_io(f, "reading " + where(k, 0));
}

// Takes parameter k's state out of memory and starts writing it to its slots. State in memory
// of its own (made by the optimizer's first step, or paged in) is copied into a buffer first.
void OptimizerOffload::Impl::write_out(size_t k) {
  std::vector<at::Tensor> ts = tensors_of(k);
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    DTORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.storage_offset() == 0 &&
                     t.storage().nbytes() == t.nbytes() && t.nbytes() <= slot_bytes[k],
                 "optimizer offload: shard ", k, "'s state is not a tensor of its own");
    at::DataPtr memory = release_storage(t);
    if (!pool->owns(memory)) {
      at::DataPtr buffer = pool->take(where(k, i));
      std::memcpy(buffer.get(), memory.get(), t.nbytes());
      memory = std::move(buffer);
    }
    void* data = memory.get();
    writing.push_back(
        transfer(/*write=*/true, k, i, data, std::make_shared<at::DataPtr>(std::move(memory))));
  }
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
                 "--offload-buffers ", m.o.buffers, " is too few: the optimizer steps each shard ",
                 "with its ", m.per_param, " state tensors in memory at once; give at least ",
                 std::max<size_t>(m.per_param, 1));
  size_t largest = kAlign;
  for (const auto& p : m.params) {
    DTORCH_CHECK(p.dim() == 1, "optimizer offload takes flat (1-D) parameters");
    m.slot_bytes.push_back(aligned(p.nbytes()));
    m.first.push_back(m.file_size);
    m.file_size += m.per_param * m.slot_bytes.back();
    largest = std::max(largest, m.slot_bytes.back());
  }
  m.open_file();
  m.pool = std::make_unique<BufferPool>(m.o.buffers, largest);
}

OptimizerOffload::~OptimizerOffload() {
  Impl& m = *impl_;
  try {
    m.finish_writes();
    for (auto& [k, reads] : m.reading) {
      for (const auto& f : reads)
        wait_io(f, "reading " + m.where(k, 0));
    }
  } catch (const std::exception&) {
    // The run ends with the error that stopped it; the file goes with the descriptor.
  }
  m.reading.clear();
  if (m.fd >= 0) {
    // Nothing the thread was given may use the descriptor after this.
    auto last = std::make_shared<Transfer>();
    m.io.submit([last] { last->finish(""); });
    try {
      wait_io(last, "the last transfer to " + m.path);
    } catch (const std::exception&) {
    }
    ::close(m.fd);
  }
}

void OptimizerOffload::step(const at::Tensor& found_inf) {
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  m.finish_writes();
  // Each shard steps alone: the others' gradients are hidden from the optimizer meanwhile.
  std::vector<at::Tensor> grads;
  for (auto& p : m.params)
    grads.push_back(std::exchange(p.mutable_grad(), at::Tensor()));
  struct Restore {
    Impl& m;
    std::vector<at::Tensor>& grads;
    ~Restore() {
      for (size_t k = 0; k < m.params.size(); ++k)
        m.params[k].mutable_grad() = grads[k];
    }
  } restore{m, grads};
  if (found_inf.defined() && found_inf.item<float>() != 0) {
    // Skipped: a step over no gradients records nothing for undo_skipped_step to take back.
    optim::step_unless(m.opt, found_inf);
    return;
  }
  std::vector<size_t> order;
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (grads[k].defined()) order.push_back(k);
  }
  for (size_t j = 0; j < order.size(); ++j) {
    const size_t k = order[j];
    m.bring_in(k);
    if (j + 1 < order.size()) {
      // Room for this shard's write when its state is not in the pool's buffers yet.
      bool pooled = m.state_of(k) != nullptr;
      for (const auto& t : m.tensors_of(k))
        pooled = pooled && m.pool->owns(t.storage().data_ptr());
      m.read_ahead(order[j + 1], pooled ? 0 : m.per_param);
    }
    m.params[k].mutable_grad() = grads[k];
    m.opt.step();
    m.params[k].mutable_grad() = at::Tensor();
    m.write_out(k);
  }
}

void OptimizerOffload::page_in_all() {
  Impl& m = *impl_;
  m.finish_writes();
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (!m.reading.count(k)) {
      std::vector<at::Tensor> ts = m.tensors_of(k);
      for (size_t i = 0; i < ts.size(); ++i) {
        if (!holds_storage(ts[i])) m.read_into(k, i, ts[i], map_memory(m.slot_bytes[k]));
      }
    }
  }
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (m.reading.count(k)) m.bring_in(k);
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

const std::string& OptimizerOffload::path() const {
  return impl_->path;
}

}  // namespace dtorch::zero
