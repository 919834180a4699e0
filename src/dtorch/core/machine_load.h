// What else a machine's CPUs ran while a job measured it (Note [Others on the machine]).
#pragma once

#include <chrono>
#include <string>

namespace dtorch {

// Note [Others on the machine]
// Every rate dtorch plan calibrate measures and every step plan --validate times includes
// whatever else ran on the machine meanwhile, and ranks that meet in every layer pay for it
// twice: a rank whose core another process took makes its partner wait too. Calibrations at 2
// ranks on a 2-core machine measured a lockstep fraction of 0.01 to 0.08 alone (five runs) and
// 0.44 beside one busy process (`yes > /dev/null`), which also took the fp32 matmul rate from
// 99 to 65 GFLOP/s. So both say when others took a noticeable share (there: 38%). Linux counts
// every core's busy time (/proc/stat: all but idle and I/O wait, the hypervisor's steal
// included) and each process's own (getrusage); the busy time the job did not spend, over the
// cores' time, is what the others took. In a container /proc/stat counts the host's cores.

/// CPU seconds (user and system) of this process's threads.
double own_cpu_seconds();
/// CPU seconds of this process's children that ended and were waited for, with their own
/// children's that they waited for.
double children_cpu_seconds();

/// Counts the machine's busy CPU time from construction on.
class MachineLoad {
 public:
  MachineLoad();
  /// The share of the machine's CPU time since construction (every core's over the wall time)
  /// that processes other than the job took, given the CPU seconds the job spent meanwhile;
  /// 0 where Linux does not say (no /proc/stat).
  double others_share(double job_cpu_seconds) const;

 private:
  double busy_ = -1;  // the machine's busy CPU seconds at construction
  std::chrono::steady_clock::time_point start_;
};

/// Whether others took enough of the machine (a tenth) that a user should hear of it.
inline bool noticeable(double others_share) {
  return others_share >= 0.1;
}

/// "other processes took N% of this machine's CPU time while <what>", for a warning.
std::string others_took(double others_share, const std::string& what);

}  // namespace dtorch
