// dtorch under Open MPI's mpirun: ranks started by mpirun train with no torchrun variables, and
// `dtorch launch` started once per node by mpirun fills its node flags from Open MPI.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"
#include "launch/scoped_env.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;

const std::vector<std::string> kTinyTrain = {"--train-samples", "512", "--test-samples", "256",
                                             "--epochs",        "1",   "--progress",     "lines"};

class Mpirun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!paths::exists("/usr/bin/mpirun")) {
      GTEST_SKIP() << "/usr/bin/mpirun is not installed (Debian: openmpi-bin)";
    }
  }
  // mpirun -np N --oversubscribe ARGS... (this machine may have fewer cores than ranks).
  testing::CommandResult mpirun(const std::string& name, int np, std::vector<std::string> args,
                                double limit = 60) {
    std::vector<std::string> argv = {"/usr/bin/mpirun", "-np", std::to_string(np),
                                     "--oversubscribe"};
    argv.insert(argv.end(), args.begin(), args.end());
    // Open MPI refuses to run as root without both of these; harmless for other users.
    return testing::run_command(
        name, argv, limit,
        {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "DTORCH_LOG_LEVEL=debug"});
  }
  testing::ScopedEnv env_;
};

size_t metric_lines(const std::string& out) {
  return testing::epochs_of(out).size();
}

TEST_F(Mpirun, TwoRanksTrain) {
  std::string out = testing::scratch_dir("mpirun_train") + "/run";
  std::vector<std::string> args = {DTORCH_CLI, "train", "--out", out};
  args.insert(args.end(), kTinyTrain.begin(), kTinyTrain.end());
  auto r = mpirun("mpirun_train_cmd", 2, args);
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "launch environment: Open MPI (OMPI_COMM_WORLD_RANK=1")) << r.err;
  EXPECT_TRUE(contains(r.err, "2 rank(s)")) << r.err;
  EXPECT_EQ(metric_lines(out), 1u);
}

// Note [Self-launch]: a process mpirun started is a rank already; --nproc-per-node does not
// make each of them start workers of its own.
TEST_F(Mpirun, BenchUnderMpirunRunsAsItsRanks) {
  auto r = mpirun("mpirun_bench", 2,
                  {DTORCH_CLI, "bench", "allreduce", "--nproc-per-node", "3", "--bytes", "1024",
                   "--iters", "2"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "\"nproc\":2")) << r.out;
  EXPECT_TRUE(contains(r.err, "--nproc-per-node is ignored")) << r.err;
}

TEST_F(Mpirun, OneLauncherPerNodeStartsTheRanks) {
  std::string out = testing::scratch_dir("mpirun_launch") + "/run";
  std::vector<std::string> args = {
      DTORCH_CLI, "launch", "--nproc-per-node", "2", "--", DTORCH_CLI, "train", "--out", out};
  args.insert(args.end(), kTinyTrain.begin(), kTinyTrain.end());
  auto r = mpirun("mpirun_launch_cmd", 1, args);
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "nodes from Open MPI (OMPI_COMM_WORLD_RANK=0")) << r.err;
  EXPECT_TRUE(contains(r.err, "[n0 r1]")) << r.err;
  EXPECT_EQ(metric_lines(out), 1u);
}

TEST_F(Mpirun, TwoLaunchersOnOneNodeAreRefused) {
  auto r = mpirun("mpirun_two_launchers", 2,
                  {DTORCH_CLI, "launch", "--nproc-per-node", "1", "--", "/bin/true"}, 30);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "mpirun --npernode 1")) << r.out << r.err;
}

}  // namespace
}  // namespace dtorch
