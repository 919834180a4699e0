// Note [Out of memory]: a failed allocation on one rank is the one error a user can act on
// with numbers: how big the model state is per rank under each strategy (the ZeRO paper's
// formulas), against what the machine or the job's cgroup allows. The trainer catches the
// allocation failure, throws OutOfMemoryError with this message, and the launcher ends the
// other ranks naming this one (Note [Failure diagnosis]). A rank the kernel's OOM killer ends
// instead gets the launcher's SIGKILL hint: no code runs in a killed process.
#include "dtorch/report/out_of_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <new>
#include <sstream>
#include <vector>

#include "dtorch/core/error.h"

namespace dtorch::report {
namespace {

int64_t kib_field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream v(line.substr(key.size() + 1));
    int64_t kib = 0;
    v >> kib;
    return kib * 1024;
  }
  return 0;
}

// A cgroup's memory file: its bytes, 0 when absent or "max".
int64_t cgroup_bytes(const char* file) {
  std::ifstream in(std::string("/sys/fs/cgroup/") + file);
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  try {
    return std::stoll(v);
  } catch (...) {
    return 0;
  }
}

std::string gib(double bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(bytes < 10.0 * (1 << 30) ? 2 : 1);
  os << bytes / double(1 << 30) << " GiB";
  return os.str();
}

}  // namespace

double model_state_bytes(int zero_stage, double P, int N, double resident_unit_bytes,
                         double optimizer_bytes) {
  const double n = N < 1 ? 1 : N;
  if (zero_stage == 0) return (8 + optimizer_bytes) * P;
  if (zero_stage == 1) return 8 * P + optimizer_bytes * P / n;
  if (zero_stage == 2) return 4 * P + (4 + optimizer_bytes) * P / n;
  return (8 + optimizer_bytes) * P / n + resident_unit_bytes;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  m.rss = kib_field("/proc/self/status", "VmRSS");
  m.peak_rss = kib_field("/proc/self/status", "VmHWM");
  m.available = kib_field("/proc/meminfo", "MemAvailable");
  m.swap_free = kib_field("/proc/meminfo", "SwapFree");
  m.total = kib_field("/proc/meminfo", "MemTotal");
  m.cgroup_limit = cgroup_bytes("memory.max");
  m.cgroup_usage = cgroup_bytes("memory.current");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    m.address_limit = static_cast<int64_t>(as.rlim_cur);
  return m;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string what = e.what();
  return what.find("can't allocate memory") != std::string::npos ||
         what.find("out of memory") != std::string::npos;
}

std::string out_of_memory_message(const std::string& allocator_says, const MemoryContext& c,
                                  const ProcessMemory& m, const DeviceMemory& gpu) {
  std::ostringstream os;
  // LibTorch's allocator message goes on with a stack trace: its first line says it all.
  const std::string says = allocator_says.substr(0, allocator_says.find('\n'));
  os << "rank " << c.rank << " ran out of memory (" << says.substr(0, 300) << ") holding ";
  if (c.device.is_cuda()) {
    os << gib(double(gpu.allocated)) << " in tensors on " << c.device << " ("
       << gib(double(gpu.peak_allocated)) << " at most, " << gib(double(gpu.reserved))
       << " reserved by the caching allocator), of the GPU's " << gib(double(gpu.total)) << ".";
  } else {
    os << gib(double(m.rss)) << " resident, " << gib(double(m.peak_rss))
       << " at most, of the machine's " << gib(double(m.total));
    if (m.cgroup_limit > 0)
      os << " (this job's cgroup allows " << gib(double(m.cgroup_limit)) << ")";
    if (m.address_limit > 0) {
      os << " (this process may map " << gib(double(m.address_limit))
         << ": its address space is limited, ulimit -v)";
    }
    os << ", shared by every rank on the node.";
  }
  if (c.parameters > 0) {
    const double opt = c.optimizer_bytes;
    const double P = double(c.parameters);
    os << " " << c.model << " has " << c.parameters / 1000000 << "M parameters; its model state "
       << "per rank at " << c.ranks << " data-parallel rank(s) (fp32, " << c.optimizer << "): ddp "
       << gib(model_state_bytes(0, P, c.ranks, 0, opt)) << ", zero1 "
       << gib(model_state_bytes(1, P, c.ranks, 0, opt)) << ", zero2 "
       << gib(model_state_bytes(2, P, c.ranks, 0, opt)) << ", zero3 "
       << gib(model_state_bytes(3, P, c.ranks, 0, opt))
       << " (plus activations, which grow with --batch-size).";
  }
  std::vector<std::string> fits;
  if (c.zero_stage != 3) fits.push_back("--strategy zero3 (shards everything)");
  if (!c.activation_checkpointing)
    fits.push_back("--activation-checkpointing (recomputes activations)");
  if (c.batch_size > 1)
    fits.push_back("--batch-size " + std::to_string(c.batch_size / 2) + " with --accum-steps 2");
  if (!c.state_on_host && !c.device.is_cpu()) {
    fits.push_back(str("--offload-optimizer cpu", c.zero_stage == 0 ? " with a zero strategy" : "",
                       " (the optimizer's state in host memory, stepped there)"));
  }
  if (!c.optimizer_on_disk && c.device.is_cpu())
    fits.push_back("--offload-optimizer nvme --offload-dir DIR (its state on a local disk)");
  if (c.zero_stage == 3 && !c.params_on_disk && c.device.is_cpu())
    fits.push_back("--offload-params nvme with it (the parameter shards there too)");
  fits.push_back("fewer ranks per node (--nproc-per-node) or more nodes");
  os << " To fit: ";
  for (size_t i = 0; i < fits.size(); ++i)
    os << (i ? (i + 1 == fits.size() ? ", or " : ", ") : "") << fits[i];
  os << ".";
  return os.str();
}

std::string state_to_come_message(double bytes_per_rank, int local_ranks, const MemoryContext& c,
                                  const ProcessMemory& m) {
  const double need = bytes_per_rank * std::max(local_ranks, 1);
  double room = double(m.available) + double(m.swap_free);
  if (m.cgroup_limit > 0)  // a job's or container's limit, the nearer wall
    room = std::min(room, double(std::max<int64_t>(m.cgroup_limit - m.cgroup_usage, 0)));
  if (m.available <= 0 || need <= room) return "";
  return out_of_memory_message(
      str("before the first step: its ", c.optimizer, " state, ", gib(bytes_per_rank),
          " per rank for the ", local_ranks, " rank(s) on this node, is more than the ", gib(room),
          m.cgroup_limit > 0 ? " this job's cgroup and the machine have left"
                             : " the machine has available",
          ", and the kernel would kill the run while making it"),
      c, m);
}

}  // namespace dtorch::report
