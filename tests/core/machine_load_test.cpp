// Note [Others on the machine]: a busy child the job does not count is another's share of the
// machine; counted, it is the job's own.
#include "dtorch/core/machine_load.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>

namespace dtorch {
namespace {

double process_cpu_clock() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Spins until this process has used `seconds` of CPU time.
void spin_for(double seconds) {
  const double start = process_cpu_clock();
  volatile double sink = 0;
  while (process_cpu_clock() - start < seconds)
    for (int i = 0; i < 10000; ++i)
      sink = sink + i;
}

TEST(MachineLoad, ABusyChildIsAnothersShareUnlessTheJobCountsIt) {
  const auto start = std::chrono::steady_clock::now();
  const MachineLoad load;
  const double children0 = children_cpu_seconds(), own0 = own_cpu_seconds();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    spin_for(0.4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const double spent = children_cpu_seconds() - children0;
  // The child's time reaches this process once it was waited for; this process barely ran.
  EXPECT_GE(spent, 0.35);
  EXPECT_LT(own_cpu_seconds() - own0, 0.2);

  const double others = load.others_share(0), counted = load.others_share(spent);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long cores = sysconf(_SC_NPROCESSORS_CONF);
  ASSERT_GT(cores, 0);
  // Uncounted, the child's CPU time over the cores' time at least (other tests of a parallel
  // ctest may add theirs); counted, that much less.
  EXPECT_GE(others, 0.8 * spent / (wall * double(cores))) << "wall " << wall << " s, " << cores;
  EXPECT_LE(others, 1.0);
  EXPECT_LT(counted, others);
  EXPECT_GE(counted, 0.0);
}

TEST(MachineLoad, WarningsSayWhoTookWhatShare) {
  EXPECT_EQ(others_took(0.474, "calibrating"),
            "other processes took 47% of this machine's CPU time while calibrating");
  EXPECT_FALSE(noticeable(0.05));
  EXPECT_TRUE(noticeable(0.1));
}

}  // namespace
}  // namespace dtorch
