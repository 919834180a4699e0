// `dtorch train` meeting faults: a worker killed with SIGKILL mid-epoch under --max-restarts
// (the group restarts, resumes from the last checkpoint and ends where an uninterrupted run
// does), and a worker started with torchrun's variables but nothing at MASTER_ADDR.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::read_file;

// Three epochs of 375 small steps on 2 ranks, about half a second each here: long enough to kill a
// worker inside the second, for a fraction of the CPU that mnist-cnn's would take.
std::vector<std::string> short_run(const std::string& out) {
  return {DTORCH_CLI,        "train", "--model",        "mnist-mlp", "--epochs",     "3",
          "--train-samples", "6000",  "--test-samples", "1000",      "--batch-size", "8",
          "--seed",          "7",     "--out",          out,         "--progress",   "lines"};
}

using testing::epochs_of;

// The worker with RANK=`rank` among the children of `launcher`, or -1.
pid_t worker_pid(pid_t launcher, int rank) {
  std::string want = "RANK=" + std::to_string(rank);
  const std::string tasks = "/proc/" + std::to_string(launcher) + "/task";
  for (const std::string& task : paths::list_directory(tasks)) {
    std::istringstream children(read_file(tasks + "/" + task + "/children"));
    for (pid_t pid; children >> pid;) {
      std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
      for (std::size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
        if (env.compare(at, want.size() + 1, want + '\0') == 0) return pid;
        if (env.find('\0', at) == std::string::npos) break;
      }
    }
  }
  return -1;
}

TEST(TrainFaults, WorkerKilledMidEpochRestartsResumesAndMatchesAnUninterruptedRun) {
  std::string dir = testing::scratch_dir("train-killed");
  // The uninterrupted run launches itself, and passes --log-dir on to its launcher.
  auto whole_args = short_run(dir + "/whole");
  whole_args.insert(whole_args.end(), {"--nproc-per-node", "2", "--log-dir", dir + "/whole-logs"});
  auto whole = testing::run_command("train-killed-whole", whole_args, 120);
  ASSERT_EQ(whole.exit_code(), 0) << whole.err;
  std::string whole_log = read_file(dir + "/whole-logs/rank0.log");
  EXPECT_TRUE(contains(whole_log, "epoch 3/3: train loss")) << whole_log;
  EXPECT_TRUE(paths::exists(dir + "/whole-logs/rank1.log"));

  std::vector<std::string> args = {
      DTORCH_CLI, "launch",    "--standalone", "--nproc-per-node", "2", "--max-restarts",
      "1",        "--log-dir", dir + "/logs",  "--grace-period",   "1", "--"};
  for (const auto& a : short_run(dir + "/killed"))
    args.push_back(a);
  // Exec'd workers, which worker_pid tells apart by their environment (a forked worker's
  // /proc/PID/environ stays its launcher's: Note [Forked workers]).
  auto cli = testing::start_command(testing::scratch_dir("train-killed-cmd"), args,
                                    {"DTORCH_FORK_WORKERS=0"});
  // Kill rank 1 as soon as epoch 1's checkpoint exists: it is then inside epoch 2.
  std::string first = dir + "/killed/checkpoint-000001.dtc";
  bool saved = testing::wait_for_file(first, 90);
  if (!saved) ::kill(cli.pid, SIGKILL);
  ASSERT_TRUE(saved) << read_file(cli.dir + "/stderr");
  pid_t victim = worker_pid(cli.pid, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  auto r = testing::finish_command(cli, 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 (node 0, local rank 1, pid " + std::to_string(victim) +
                                  ") was killed by signal 9 (SIGKILL)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "restarting all workers (restart 1 of 1)")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart 1 of the group: resuming")) << r.err;
  // The restart picked up where the checkpoint left off, not at epoch 1.
  EXPECT_TRUE(contains(r.err, "resuming from " + dir + "/killed/checkpoint-00000")) << r.err;
  auto restarted = r.err.find("restart 1 of 1");
  ASSERT_NE(restarted, std::string::npos);
  EXPECT_FALSE(contains(r.err.substr(restarted), "epoch 1/3:")) << r.err;

  auto a = epochs_of(dir + "/whole"), b = epochs_of(dir + "/killed");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.back()["epoch"], 2);
  double acc_whole = a.back()["test_accuracy"], acc_killed = b.back()["test_accuracy"];
  EXPECT_NEAR(acc_killed, acc_whole, 0.005);
  EXPECT_GT(acc_whole, 0.6);

  std::string log0 = read_file(dir + "/logs/rank0.log"), log1 = read_file(dir + "/logs/rank1.log");
  EXPECT_TRUE(contains(log0, "resuming from")) << log0;
  EXPECT_TRUE(contains(log1, "was killed by signal 9 (SIGKILL)")) << log1;
  EXPECT_TRUE(contains(log1, "restart 1 of 1")) << log1;
}

// Note [Checkpoint on a signal]: SIGUSR1 to `dtorch train --nproc-per-node 2` (its launcher)
// inside the run's one epoch. Every rank finishes the agreed step, one checkpoint is written
// inside the epoch, and the job exits 75; `--resume` then ends with an uninterrupted run's model,
// byte for byte, and the same epoch record (the epoch's own checkpoint replaces the one taken
// inside it).
TEST(TrainFaults, SignalledRunCheckpointsInsideAnEpochAndResumesBitForBit) {
  const std::string dir = testing::scratch_dir("train-signalled");
  auto run = [&](const std::string& out) {
    return std::vector<std::string>{
        DTORCH_CLI,         "train", "--model",         "mnist-cnn", "--epochs",      "1",
        "--seed",           "3",     "--train-samples", "4096",      "--batch-size",  "16",
        "--test-samples",   "256",   "--progress",      "off",       "--print-every", "5",
        "--nproc-per-node", "2",     "--out",           out};
  };
  auto whole = testing::run_command("train-signalled-whole", run(dir + "/whole"), 120);
  ASSERT_EQ(whole.exit_code(), 0) << whole.err;

  auto cli =
      testing::start_command(testing::scratch_dir("train-signalled-cmd"), run(dir + "/signalled"));
  // Inside the epoch (128 steps of 16 x 2 samples; the ranks agree on a step about 20-45
  // later): after its step 10 was reported.
  const bool stepping = testing::wait_until(
      [&] { return contains(read_file(cli.dir + "/stderr"), "step 10/128"); }, 60);
  if (!stepping) ::kill(cli.pid, SIGKILL);
  ASSERT_TRUE(stepping) << read_file(cli.dir + "/stderr");
  ASSERT_EQ(::kill(cli.pid, SIGUSR1), 0);
  auto r = testing::finish_command(cli, 60);
  EXPECT_EQ(r.exit_code(), 75) << r.err;
  EXPECT_TRUE(contains(r.err, "dtorch launch: got SIGUSR1; asking every worker to checkpoint"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "every rank checkpoints after step ")) << r.err;
  EXPECT_TRUE(contains(r.err, "the workers checkpointed on SIGUSR1 and stopped (exit 75)"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "epoch 1/1:")) << "stopped after the epoch: " << r.err;
  EXPECT_TRUE(paths::exists(dir + "/signalled/checkpoint-000001.dtc")) << r.err;
  EXPECT_FALSE(paths::exists(dir + "/signalled/model.pt"));

  auto args = run(dir + "/signalled");
  args.push_back("--resume");
  auto resumed = testing::run_command("train-signalled-resumed", args, 120);
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "inside epoch 1, after ")) << resumed.err;
  EXPECT_EQ(read_file(dir + "/signalled/model.pt"), read_file(dir + "/whole/model.pt"))
      << "the resumed run's weights differ from the uninterrupted run's";
  auto a = epochs_of(dir + "/whole"), b = epochs_of(dir + "/signalled");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u) << "the epoch record was lost or written twice";
  EXPECT_EQ(a[0]["step"], b[0]["step"]);
  EXPECT_NEAR(a[0]["train_loss"].get<double>(), b[0]["train_loss"].get<double>(), 1e-12);
  EXPECT_EQ(a[0]["test_loss"], b[0]["test_loss"]);
}

// A later round of an elastic job (`dtorch launch --rdzv-backend c10d` after a node joined)
// restarts the workers with no failure counted: DTORCH_ELASTIC_ROUND makes them resume anyway.
TEST(TrainFaults, ALaterElasticRoundResumesWithoutBeingAsked) {
  std::string out = testing::scratch_dir("train-elastic-round") + "/run";
  std::vector<std::string> args = {DTORCH_CLI,        "train", "--model",        "mnist-mlp",
                                   "--train-samples", "512",   "--test-samples", "256",
                                   "--progress",      "off",   "--out",          out,
                                   "--epochs"};
  auto first = args, second = args;
  first.push_back("1");
  second.push_back("2");
  auto r = testing::run_command("train-elastic-round-0", first, 60, {"DTORCH_ELASTIC_ROUND=0"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_FALSE(contains(r.err, "resuming")) << r.err;
  r = testing::run_command("train-elastic-round-1", second, 60, {"DTORCH_ELASTIC_ROUND=1"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "elastic round 1: resuming from " + out)) << r.err;
  EXPECT_TRUE(contains(r.err, "resuming from " + out + "/checkpoint-000001")) << r.err;
  EXPECT_FALSE(contains(r.err, "epoch 1/2:")) << "epoch 1 was done in round 0: " << r.err;
  EXPECT_TRUE(contains(r.err, "epoch 2/2:")) << r.err;
}

TEST(TrainFaults, WorkerWithNothingAtTheMasterFailsWithinTheTimeout) {
  std::string out = testing::scratch_dir("train-no-master") + "/run";
  std::string port = std::to_string(testing::free_port());
  std::vector<std::string> args = {DTORCH_CLI, "train", "--epochs", "1", "--out", out};
  std::vector<std::string> env = {"RANK=1",
                                  "WORLD_SIZE=2",
                                  "LOCAL_RANK=1",
                                  "LOCAL_WORLD_SIZE=2",
                                  "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + port,
                                  "DTORCH_TIMEOUT=2"};
  auto r = testing::run_command("train-no-master-1", args, 30, env);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(
      contains(r.err, "cannot reach the rendezvous store at 127.0.0.1:" + port + " within 2 s"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "MASTER_ADDR/MASTER_PORT")) << r.err;

  // Rank 0 serves the store itself (torchrun-style, no agent store) and waits for rank 1.
  env[0] = "RANK=0";
  env[2] = "LOCAL_RANK=0";
  r = testing::run_command("train-no-master-0", args, 30, env);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(contains(r.err, "timed out after 2 s: 1 of 2 ranks arrived; missing rank(s) 1"))
      << r.err;

  // A master that does not resolve.
  env[4] = "MASTER_ADDR=no-such-host.invalid";
  env[0] = "RANK=1";
  env[2] = "LOCAL_RANK=1";
  r = testing::run_command("train-no-master-name", args, 30, env);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(contains(r.err, "no-such-host.invalid:" + port)) << r.err;
}

}  // namespace
}  // namespace dtorch
