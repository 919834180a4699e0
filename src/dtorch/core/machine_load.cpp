// Note [Others on the machine]: the machine's busy time against the job's own.
#include "dtorch/core/machine_load.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

namespace dtorch {
namespace {

double seconds_of(const rusage& u) {
  return double(u.ru_utime.tv_sec) + double(u.ru_stime.tv_sec) +
         (double(u.ru_utime.tv_usec) + double(u.ru_stime.tv_usec)) * 1e-6;
}

// Every core's busy seconds since boot and the number of cores, from /proc/stat's first line
// ("cpu user nice system idle iowait irq softirq steal ...", in clock ticks); busy -1 where it
// cannot be read.
struct Busy {
  double seconds = -1;
  int cores = 0;
};
Busy machine_busy() {
  Busy b;
  std::ifstream in("/proc/stat");
  std::string line;
  if (!std::getline(in, line) || line.rfind("cpu ", 0) != 0) return b;
  std::istringstream fields(line.substr(4));
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(fields >> user >> nice >> system >> idle >> iowait >> irq >> softirq)) return b;
  fields >> steal;  // absent before Linux 2.6.11
  for (std::string l; std::getline(in, l);)
    if (l.rfind("cpu", 0) == 0) ++b.cores;
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0 || b.cores == 0) return b;
  b.seconds = (user + nice + system + irq + softirq + steal) / double(ticks);
  return b;
}

}  // namespace

double own_cpu_seconds() {
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? seconds_of(u) : 0;
}

double children_cpu_seconds() {
  rusage u{};
  return getrusage(RUSAGE_CHILDREN, &u) == 0 ? seconds_of(u) : 0;
}

MachineLoad::MachineLoad()
    : busy_(machine_busy().seconds), start_(std::chrono::steady_clock::now()) {}

double MachineLoad::others_share(double job_cpu_seconds) const {
  const Busy now = machine_busy();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (busy_ < 0 || now.seconds < 0 || wall <= 0) return 0;
  return std::clamp((now.seconds - busy_ - job_cpu_seconds) / (wall * now.cores), 0.0, 1.0);
}

std::string others_took(double others_share, const std::string& what) {
  return "other processes took " + std::to_string(std::lround(100 * others_share)) +
         "% of this machine's CPU time while " + what;
}

}  // namespace dtorch
