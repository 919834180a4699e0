// Shared-memory collectives for the ranks of one node (see shm_allreduce.h).
#include "dtorch/comm/shm_allreduce.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dtorch/core/error.h"

namespace dtorch::comm {

// Note [Shared-memory allreduce]
// The segment holds a header (pids and two counters per rank), one slot per rank and one
// result slot. For each chunk of at most kSlotBytes, a rank copies its data into its slot and
// bumps `arrived`; once every rank has arrived, rank r sums its 1/world share of the chunk
// over all slots (in rank order, so every rank gets bit-identical results) into the result
// slot and bumps `reduced`; once every rank has reduced, each copies the result out.
// Reuse is safe without a third barrier: a rank overwrites its slot for the next chunk only
// after every rank reduced (so read) this one, and a rank writes the result slot for the
// next chunk only after every rank arrived there, i.e. finished copying this chunk's result.
// Reduce-scatter and allgather use the same two counters: a rank fills its slot, waits for
// all arrivals, reads what it needs from the others' slots, bumps `reduced`, and may refill
// its slot only once every rank has bumped `reduced` (finished reading).

namespace {

constexpr int kMaxRanks = 512;
constexpr size_t kPage = 4096;

size_t round_up(size_t x, size_t to) {
  return (x + to - 1) / to * to;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

template <typename T>
void sum_slots(T* out, char* const* slots, int world, int64_t offset, int64_t n) {
  const T* first = reinterpret_cast<const T*>(slots[0]) + offset;
  std::memcpy(out, first, n * sizeof(T));
  for (int r = 1; r < world; ++r) {
    const T* in = reinterpret_cast<const T*>(slots[r]) + offset;
    for (int64_t i = 0; i < n; ++i)
      out[i] += in[i];
  }
}

template <typename T>
void reduce_share(T* out, char* const* slots, int world, int64_t begin, int64_t end) {
  const T* first = reinterpret_cast<const T*>(slots[0]);
  std::memcpy(out + begin, first + begin, (end - begin) * sizeof(T));
  for (int r = 1; r < world; ++r) {
    const T* in = reinterpret_cast<const T*>(slots[r]);
    for (int64_t i = begin; i < end; ++i)
      out[i] += in[i];
  }
}

}  // namespace

struct ShmAllreduce::Counter {
  alignas(64) std::atomic<uint64_t> value{0};
};

struct ShmAllreduce::Header {
  std::atomic<uint32_t> ready{0};
  int32_t world = 0;
  std::atomic<int32_t> pids[kMaxRanks];
  Counter arrived[kMaxRanks];
  Counter reduced[kMaxRanks];
};

ShmAllreduce::ShmAllreduce(const std::string& name, int rank, int world,
                           std::chrono::milliseconds timeout)
    : name_(name), rank_(rank), world_(world), timeout_(timeout), owner_(rank == 0) {
  DTORCH_CHECK_T(CommError, world >= 1 && world <= kMaxRanks, "shared-memory allreduce supports ",
                 "up to ", kMaxRanks, " ranks per node, got ", world);
  bytes_ = round_up(sizeof(Header), kPage) + static_cast<size_t>(world + 1) * kSlotBytes;
  int fd = -1;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  if (owner_) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    DTORCH_CHECK_T(CommError, fd >= 0, "cannot create shared memory ", name, ": ",
                   std::strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      DTORCH_FAIL(CommError, "cannot size shared memory ", name, " to ", bytes_,
                  " bytes: ", std::strerror(err),
                  " (is /dev/shm large enough? set DTORCH_SHM=0 to use Gloo)");
    }
  } else {
    while ((fd = shm_open(name.c_str(), O_RDWR, 0600)) < 0) {
      DTORCH_CHECK_T(CommError, std::chrono::steady_clock::now() < deadline, "shared memory ", name,
                     " did not appear: ", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    struct stat st {};
    while (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) < bytes_) {
      DTORCH_CHECK_T(CommError, std::chrono::steady_clock::now() < deadline, "shared memory ", name,
                     " never reached its size");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  DTORCH_CHECK_T(CommError, base_ != MAP_FAILED, "cannot map shared memory ", name, ": ",
                 std::strerror(errno));
  header_ = static_cast<Header*>(base_);
  if (owner_) {
    new (header_) Header();
    header_->world = world;
    header_->ready.store(1, std::memory_order_release);
  }
  while (header_->ready.load(std::memory_order_acquire) != 1) {
    DTORCH_CHECK_T(CommError, std::chrono::steady_clock::now() < deadline, "shared memory ", name,
                   " was never initialised by rank 0");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  header_->pids[rank].store(getpid(), std::memory_order_release);
  if (owner_) {
    // Once everyone is attached the name is not needed: unlinking now leaves nothing behind
    // in /dev/shm even if the job is killed.
    for (int r = 0; r < world; ++r) {
      while (header_->pids[r].load(std::memory_order_acquire) == 0) {
        DTORCH_CHECK_T(CommError, std::chrono::steady_clock::now() < deadline, "rank ", r,
                       " never attached to shared memory ", name);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    shm_unlink(name.c_str());
  }
}

ShmAllreduce::~ShmAllreduce() {
  if (base_ && base_ != MAP_FAILED) munmap(base_, bytes_);
}

bool ShmAllreduce::supports(const at::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

char* ShmAllreduce::slot(int r) const {
  return static_cast<char*>(base_) + round_up(sizeof(Header), kPage) +
         static_cast<size_t>(r) * kSlotBytes;
}

void ShmAllreduce::wait_all(Counter* counters, uint64_t target, const char* phase) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_check = start + std::chrono::milliseconds(100);
  long spins = 0;
  for (int r = 0; r < world_; ++r) {
    while (counters[r].value.load(std::memory_order_acquire) < target) {
      // Spin briefly (the peer is usually microseconds away), then yield the core, then sleep
      // so a long wait (a slow peer loading data) does not burn a core.
      if (++spins < 2000) {
        cpu_relax();
        continue;
      }
      if (spins < 20000) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      auto now = Clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(100);
      std::string behind, gone;
      for (int q = 0; q < world_; ++q) {
        if (counters[q].value.load(std::memory_order_acquire) >= target) continue;
        int pid = header_->pids[q].load();
        bool dead = pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
        (dead ? gone : behind) +=
            (dead ? gone : behind).empty() ? std::to_string(q) : ", " + std::to_string(q);
      }
      DTORCH_CHECK_T(CommError, gone.empty(), "rank(s) ", gone,
                     " exited while this rank waited for them in a shared-memory collective (",
                     phase, ")");
      DTORCH_CHECK_T(CommError, now - start < timeout_, "timed out after ",
                     timeout_.count() / 1000.0, " s in a shared-memory collective (", phase,
                     ") waiting for rank(s) ", behind);
    }
  }
}

void ShmAllreduce::sum(at::Tensor& t) {
  DTORCH_CHECK(supports(t), "shared-memory allreduce needs a contiguous float CPU tensor");
  const int64_t esize = t.element_size();
  const int64_t total = t.numel() * esize;
  char* data = static_cast<char*>(t.data_ptr());
  std::vector<char*> slots(world_);
  for (int r = 0; r < world_; ++r)
    slots[r] = slot(r);
  char* result = slot(world_);
  for (int64_t off = 0; off < total; off += kSlotBytes) {
    const int64_t n = std::min<int64_t>(kSlotBytes, total - off);
    ++seq_;
    std::memcpy(slots[rank_], data + off, n);
    header_->arrived[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->arrived, seq_, "arrive");
    const int64_t elems = n / esize, per = (elems + world_ - 1) / world_;
    const int64_t begin = std::min(elems, rank_ * per), end = std::min(elems, begin + per);
    if (t.scalar_type() == at::kFloat) {
      reduce_share(reinterpret_cast<float*>(result), slots.data(), world_, begin, end);
    } else {
      reduce_share(reinterpret_cast<double*>(result), slots.data(), world_, begin, end);
    }
    header_->reduced[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->reduced, seq_, "reduce");
    std::memcpy(data + off, result, n);
  }
}

}  // namespace dtorch::comm

namespace dtorch::comm {

void ShmAllreduce::reduce_scatter_sum(const at::Tensor& in, at::Tensor& out) {
  DTORCH_CHECK(supports(in) && supports(out) && in.scalar_type() == out.scalar_type(),
               "shared-memory reduce-scatter needs contiguous float CPU tensors of one dtype");
  const int64_t n = out.numel(), esize = in.element_size();
  DTORCH_CHECK(in.numel() == n * world_, "reduce-scatter input has ", in.numel(),
               " elements, expected ", n * world_);
  // Each round moves `per` elements of every rank's chunk: the slot holds world pieces.
  const int64_t per = std::max<int64_t>(1, kSlotBytes / (esize * world_));
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  std::vector<char*> slots(world_);
  for (int r = 0; r < world_; ++r)
    slots[r] = slot(r);
  for (int64_t off = 0; off < n; off += per) {
    const int64_t m = std::min(per, n - off);
    ++seq_;
    for (int q = 0; q < world_; ++q)
      std::memcpy(slots[rank_] + q * per * esize, src + (q * n + off) * esize, m * esize);
    header_->arrived[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->arrived, seq_, "reduce-scatter arrive");
    if (in.scalar_type() == at::kFloat) {
      sum_slots(reinterpret_cast<float*>(dst) + off, slots.data(), world_, rank_ * per, m);
    } else {
      sum_slots(reinterpret_cast<double*>(dst) + off, slots.data(), world_, rank_ * per, m);
    }
    header_->reduced[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->reduced, seq_, "reduce-scatter read");
  }
}

void ShmAllreduce::allgather(const at::Tensor& in, at::Tensor& out) {
  DTORCH_CHECK(in.device().is_cpu() && in.is_contiguous() && out.is_contiguous() &&
                   in.scalar_type() == out.scalar_type(),
               "shared-memory allgather needs contiguous CPU tensors of one dtype");
  const int64_t esize = in.element_size(), total = in.numel() * esize;
  DTORCH_CHECK(out.numel() == in.numel() * world_, "allgather output has ", out.numel(),
               " elements, expected ", in.numel() * world_);
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t off = 0; off < total; off += kSlotBytes) {
    const int64_t m = std::min<int64_t>(kSlotBytes, total - off);
    ++seq_;
    std::memcpy(slot(rank_), src + off, m);
    header_->arrived[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->arrived, seq_, "allgather arrive");
    for (int q = 0; q < world_; ++q)
      std::memcpy(dst + q * total + off, slot(q), m);
    header_->reduced[rank_].value.store(seq_, std::memory_order_release);
    wait_all(header_->reduced, seq_, "allgather read");
  }
}

}  // namespace dtorch::comm
