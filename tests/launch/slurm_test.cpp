// dtorch under a real Slurm (a private slurmctld + slurmd on 127.0.0.1): srun starting the
// ranks, the example job scripts submitted with sbatch, and a classic job-script mistake.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/scoped_env.h"
#include "launch/slurm_cluster.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::SlurmCluster;
using Clock = std::chrono::steady_clock;

// A tiny run: enough to start every rank, train one epoch and write metrics.jsonl.
const std::vector<std::string> kTinyTrain = {"--train-samples", "512", "--test-samples", "256",
                                             "--epochs",        "1",   "--progress",     "lines"};

size_t metric_lines(const std::string& out) {
  return testing::epochs_of(out).size();
}

class SlurmJobs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = SlurmCluster::unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    cluster_ = std::make_unique<SlurmCluster>();
    std::string error;
    ASSERT_TRUE(cluster_->wait_ready(30, &error)) << error;
  }
  void TearDown() override { cluster_.reset(); }  // cancels jobs, stops the daemons

  // Submits a job script from examples/slurm and waits for it to end; the flags fit the one
  // test node (the scripts ask for a real cluster's nodes, CPUs and memory). Returns the job's
  // final JobState and ExitCode as scontrol shows them ("COMPLETED 0:0").
  std::string sbatch(const std::string& script, const std::vector<std::string>& flags,
                     const std::string& out, std::vector<std::string> env = {},
                     const std::vector<std::string>& train_flags = {}) {
    std::vector<std::string> argv = {"sbatch",   "--parsable", "--nodes=1",
                                     "--time=5", "--mem=100M", "--output=" + out + "/job.out"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(std::string(DTORCH_SOURCE_DIR) + "/examples/slurm/" + script);
    argv.insert(argv.end(), kTinyTrain.begin(), kTinyTrain.end());
    argv.insert(argv.end(), train_flags.begin(), train_flags.end());
    env.push_back(std::string("DTORCH=") + DTORCH_CLI);
    env.push_back("OUT=" + out + "/run");
    auto r = cluster_->run("sbatch", argv, 30, env);
    if (r.exit_code() != 0) return "sbatch failed: " + r.err;
    std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
    // sbatch --wait polls slowly (tens of seconds); scontrol answers at once.
    auto deadline = Clock::now() + std::chrono::seconds(90);
    std::smatch m;
    while (Clock::now() < deadline) {
      std::string job = cluster_->run("scontrol", {"scontrol", "show", "job", "-o", id}, 10).out;
      static const std::regex state("JobState=(\\w+).* ExitCode=(\\d+:\\d+)");
      if (std::regex_search(job, m, state) &&
          !std::regex_match(m[1].str(), std::regex("PENDING|RUNNING|CONFIGURING|COMPLETING"))) {
        return m[1].str() + " " + m[2].str();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return "job " + id + " did not end within 90 s";
  }

  testing::ScopedEnv env_;  // no launcher variables of an outer job leak into this cluster's
  std::unique_ptr<SlurmCluster> cluster_;
};

// `srun` starting 2 tasks of a tiny `dtorch train` writing to `out`.
std::vector<std::string> srun_train(const std::string& out) {
  std::vector<std::string> argv = {"srun",
                                   "--ntasks=2",
                                   "--cpus-per-task=1",
                                   "--time=5",
                                   "--kill-on-bad-exit=1",
                                   DTORCH_CLI,
                                   "train",
                                   "--out",
                                   out};
  argv.insert(argv.end(), kTinyTrain.begin(), kTinyTrain.end());
  return argv;
}

TEST_F(SlurmJobs, SrunStartsOneRankPerTask) {
  std::string out = testing::scratch_dir("slurm_srun") + "/run";
  std::vector<std::string> argv = srun_train(out);
  auto r = cluster_->run("srun", argv, 60, {"DTORCH_LOG_LEVEL=debug"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err << cluster_->logs();
  EXPECT_TRUE(contains(r.err, "2 rank(s)")) << r.err;
  // Both ranks found themselves through Slurm, rendezvous port derived from the job id.
  EXPECT_TRUE(contains(r.err, "launch environment: Slurm (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2)"))
      << r.err;
  EXPECT_TRUE(contains(
      r.err, "master 127.0.0.1:" + std::to_string(20000 + cluster_->first_job_id() % 10000)))
      << r.err;
  EXPECT_EQ(metric_lines(out), 1u);
}

TEST_F(SlurmJobs, SbatchOneTaskPerRank) {
  std::string out = testing::scratch_dir("slurm_sbatch_per_rank");
  std::string end =
      sbatch("train_per_rank.sbatch", {"--ntasks-per-node=2", "--cpus-per-task=1"}, out);
  std::string log = testing::read_file(out + "/job.out");
  ASSERT_EQ(end, "COMPLETED 0:0") << log << cluster_->logs();
  EXPECT_TRUE(contains(log, "2 ranks on 1 node(s)")) << log;
  EXPECT_TRUE(contains(log, "2 rank(s)")) << log;
  EXPECT_EQ(metric_lines(out + "/run"), 1u) << log;
}

// README's job for several nodes, hybrid sharding (Note [Hybrid sharding]), on the test's one
// node: its 2 ranks as 2 replicas of one.
TEST_F(SlurmJobs, SbatchOneLauncherPerNode) {
  std::string out = testing::scratch_dir("slurm_sbatch_launch");
  std::string end = sbatch("train_launch.sbatch", {"--ntasks-per-node=1", "--cpus-per-task=2"}, out,
                           {"NPROC_PER_NODE=2"}, {"--strategy", "zero2", "--dp-replicate", "2"});
  std::string log = testing::read_file(out + "/job.out");
  ASSERT_EQ(end, "COMPLETED 0:0") << log << cluster_->logs();
  // The launcher took its node from the job (one node: loopback and a free port).
  EXPECT_TRUE(contains(log, "nodes from Slurm (SLURM_PROCID=0, SLURM_STEP_NUM_TASKS=1)")) << log;
  EXPECT_TRUE(contains(log, "[n0 r0]")) << log;
  EXPECT_TRUE(contains(log, "2 rank(s)")) << log;
  EXPECT_TRUE(contains(log, "mesh: dp 2 (2 replicas of 1)")) << log;
  EXPECT_EQ(metric_lines(out + "/run"), 1u) << log;
}

// Note [Checkpoint on a signal]: train_launch.sbatch signalled inside an epoch, as Slurm's
// `#SBATCH --signal=USR1@90` does before the time limit (here by scancel). Every rank
// checkpoints and stops, the launcher requeues the job, and its second run resumes from the
// checkpoint by itself (SLURM_RESTART_COUNT) and ends with an uninterrupted run's weights, byte
// for byte.
TEST_F(SlurmJobs, SignalledJobCheckpointsRequeuesAndResumesBitForBit) {
  const std::string out = testing::scratch_dir("slurm_signalled");
  const std::vector<std::string> train = {
      "--epochs",       "2",   "--seed",     "3",   "--train-samples", "2048", "--batch-size", "16",
      "--test-samples", "256", "--progress", "off", "--print-every",   "5"};
  std::vector<std::string> whole = {
      DTORCH_CLI, "launch",  "--nproc-per-node", "2",     "--",          DTORCH_CLI,
      "train",    "--model", "mnist-cnn",        "--out", out + "/whole"};
  whole.insert(whole.end(), train.begin(), train.end());
  ASSERT_EQ(testing::run_command("slurm_signalled_whole", whole, 120).exit_code(), 0);

  std::vector<std::string> argv = {
      "sbatch",
      "--parsable",
      "--nodes=1",
      "--time=5",
      "--mem=100M",
      "--ntasks-per-node=1",
      "--cpus-per-task=2",
      "--output=" + out + "/job.out",
      std::string(DTORCH_SOURCE_DIR) + "/examples/slurm/train_launch.sbatch"};
  argv.insert(argv.end(), train.begin(), train.end());
  auto r = cluster_->run(
      "sbatch", argv, 30,
      {std::string("DTORCH=") + DTORCH_CLI, "OUT=" + out + "/run", "NPROC_PER_NODE=2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
  const std::string log = out + "/job.out";
  ASSERT_TRUE(
      testing::wait_until([&] { return contains(testing::read_file(log), "step 10/128"); }, 60))
      << testing::read_file(log) << cluster_->logs();
  ASSERT_EQ(cluster_->run("scancel", {"scancel", "--signal=USR1", id}, 10).exit_code(), 0);
  std::string job;
  const bool ended = testing::wait_until(
      [&] {
        job = cluster_->run("scontrol", {"scontrol", "show", "job", "-o", id}, 10).out;
        return contains(job, "Restarts=1") && contains(job, "JobState=COMPLETED");
      },
      90);
  const std::string text = testing::read_file(log);
  ASSERT_TRUE(ended) << job << "\n" << text << cluster_->logs();
  EXPECT_TRUE(contains(job, "ExitCode=0:0")) << job;
  EXPECT_TRUE(contains(text, "got SIGUSR1; asking every worker to checkpoint and stop")) << text;
  EXPECT_TRUE(contains(text, "the workers checkpointed on SIGUSR1 and stopped (exit 75)")) << text;
  EXPECT_TRUE(contains(text, "`scontrol requeue " + id + "`: the job goes back to the queue"))
      << text;
  EXPECT_TRUE(contains(text, "Slurm requeued the job (SLURM_RESTART_COUNT=1): resuming")) << text;
  EXPECT_TRUE(contains(text, "inside epoch ")) << text;
  EXPECT_EQ(testing::read_file(out + "/run/model.pt"), testing::read_file(out + "/whole/model.pt"))
      << "the requeued job's weights differ from the uninterrupted run's";
  EXPECT_EQ(metric_lines(out + "/run"), 2u) << text;
}

// The tutorial's multi-node line, `srun torchrun --nnodes N --nproc_per_node 1 --rdzv_id
// $RANDOM --rdzv_backend c10d --rdzv_endpoint $head_node_ip:29500 train.py`, with `dtorch
// launch` for torchrun: two launchers (two tasks on the test's one node) meet at the endpoint,
// the first to bind it serves the store, and they are numbered on arrival.
TEST_F(SlurmJobs, TutorialC10dLineUnderSrun) {
  std::string out = testing::scratch_dir("slurm_sbatch_c10d");
  std::string end = sbatch("train_c10d.sbatch", {"--ntasks=2", "--cpus-per-task=1"}, out,
                           {"RDZV_PORT=" + std::to_string(testing::free_port())});
  std::string log = testing::read_file(out + "/job.out");
  ASSERT_EQ(end, "COMPLETED 0:0") << log << cluster_->logs();
  EXPECT_TRUE(contains(log, "Node IP: ")) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("round 0: 2 node\\(s\\) .*this node is n0, "
                                                "ranks 0..0 of 2")))
      << log;
  EXPECT_TRUE(contains(log, "this node is n1, ranks 1..1 of 2")) << log;
  EXPECT_TRUE(contains(log, "2 rank(s)")) << log;
  EXPECT_EQ(metric_lines(out + "/run"), 1u) << log;
}

// `export RANK=$SLURM_PROCID` in the job script runs once, so every task gets RANK=0: the rank
// that Slurm calls 1 must stop with the reason instead of joining as a second rank 0.
TEST_F(SlurmJobs, RankExportedInTheJobScriptFailsClearly) {
  std::string out = testing::scratch_dir("slurm_rank_exported") + "/run";
  std::vector<std::string> argv = srun_train(out);
  auto r = cluster_->run(
      "srun_bad", argv, 60,
      {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + std::to_string(testing::free_port())});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "RANK=0 but SLURM_PROCID=1")) << r.out << r.err;
  EXPECT_LT(r.seconds, 50);
}

}  // namespace
}  // namespace dtorch
