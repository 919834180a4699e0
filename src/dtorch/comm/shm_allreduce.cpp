// Shared-memory allreduce for the ranks of one node (see shm_allreduce.h).
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
                     " exited while this rank waited for them in a shared-memory allreduce (",
                     phase, ")");
      DTORCH_CHECK_T(CommError, now - start < timeout_, "timed out after ",
                     timeout_.count() / 1000.0, " s in a shared-memory allreduce (", phase,
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
