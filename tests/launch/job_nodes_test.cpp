// `dtorch launch` inside a batch job: the node flags it fills from Slurm, PBS and MPI
// environments when they are not given, and the refusals when it runs more than once per node.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "dtorch/core/error.h"
#include "dtorch/launch/job_nodes.h"
#include "launch/scoped_env.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

class JobNodesEnv : public ::testing::Test {
 protected:
  // Task 2 of `srun --ntasks-per-node=1` in `sbatch -N 3`.
  void slurm_one_task_per_node(int procid) {
    env_.load(R"(SLURM_JOB_ID=5150
SLURM_JOB_NODELIST=n[07-09]
SLURM_JOB_NUM_NODES=3
SLURM_NNODES=3
SLURM_NTASKS=3
SLURM_TASKS_PER_NODE=1(x3)
SLURM_STEP_ID=0
SLURM_STEP_NODELIST=n[07-09]
SLURM_STEP_NUM_NODES=3
SLURM_STEP_NUM_TASKS=3
SLURM_STEP_TASKS_PER_NODE=1(x3)
SLURM_LOCALID=0
)");
    env_.set("SLURM_PROCID", std::to_string(procid));
    env_.set("SLURM_NODEID", std::to_string(procid));
  }
  std::string fill(LaunchOptions& o, GivenNodeFlags given = {}) {
    return fill_nodes_from_job(o, given);
  }
  dtorch::testing::ScopedEnv env_;
};

TEST_F(JobNodesEnv, SlurmOneTaskPerNodeFillsTheNodeFlags) {
  slurm_one_task_per_node(2);
  LaunchOptions o;
  std::string line = fill(o);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "n07");
  EXPECT_EQ(o.master_port, 25150);
  EXPECT_TRUE(testing::contains(line, "Slurm")) << line;
  EXPECT_TRUE(testing::contains(line, "node 2 of 3")) << line;
}

TEST_F(JobNodesEnv, ExplicitFlagsWin) {
  slurm_one_task_per_node(1);
  LaunchOptions o;
  o.master_addr = "n09-ib";
  o.master_port = 31111;
  fill(o, {false, false, true, true});
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n09-ib");
  EXPECT_EQ(o.master_port, 31111);
  LaunchOptions p;
  p.nnodes = 1;
  p.node_rank = 0;
  fill(p, {true, true, false, false});
  EXPECT_EQ(p.nnodes, 1);
  EXPECT_EQ(p.node_rank, 0);
  EXPECT_EQ(p.master_addr, "127.0.0.1");  // a job-wide address would not fit a 1-node run
}

TEST_F(JobNodesEnv, SeveralTasksPerNodeIsRefusedUnlessTheFlagsAreGiven) {
  env_.load(R"(SLURM_JOB_ID=9
SLURM_JOB_NODELIST=localhost
SLURM_NNODES=1
SLURM_NTASKS=2
SLURM_TASKS_PER_NODE=2
SLURM_STEP_ID=0
SLURM_PROCID=1
SLURM_LOCALID=1
SLURM_NODEID=0
)");
  LaunchOptions o;
  try {
    fill(o);
    ADD_FAILURE() << "two launchers on one node were accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "--ntasks-per-node=1")) << e.what();
  }
  LaunchOptions p;
  EXPECT_EQ(fill(p, {true, true, false, false}), "");
}

TEST_F(JobNodesEnv, BatchScriptOfAOneNodeJobIsOneNodeOnAFreePort) {
  env_.set("SLURM_JOB_ID", "12");
  env_.set("SLURM_JOB_NODELIST", "localhost");
  env_.set("SLURM_NTASKS", "4");
  LaunchOptions o;
  fill(o);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);  // any free port: no other node needs to know it
  env_.set("MASTER_PORT", "29123");
  LaunchOptions p;
  fill(p);
  EXPECT_EQ(p.master_port, 29123);
}

TEST_F(JobNodesEnv, BatchScriptOfAMultiNodeJobIsRefused) {
  env_.set("SLURM_JOB_ID", "12");
  env_.set("SLURM_JOB_NODELIST", "n[1-4]");
  LaunchOptions o;
  try {
    fill(o);
    ADD_FAILURE() << "a launcher in the batch script of a 4-node job was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "srun --ntasks-per-node=1 dtorch launch")) << e.what();
  }
}

// mpiexec -n 2 --ppn 1 dtorch launch ... in a 2-node PBS job (Cray PALS).
TEST_F(JobNodesEnv, PbsMpiexecOncePerNode) {
  std::string nodefile = testing::scratch_dir("job_nodes_pbs") + "/nodefile";
  std::ofstream(nodefile) << "x1001c0s0b0n0\nx1001c0s0b0n0\nx1001c0s0b1n0\nx1001c0s0b1n0\n";
  env_.load(R"(PBS_JOBID=1234.polaris-pbs-01
PALS_APID=0c1d2e3f
PALS_RANKID=1
PALS_LOCAL_RANKID=0
PALS_NODEID=1
PALS_LOCAL_SIZE=1
PMI_RANK=1
PMI_SIZE=2
PMI_LOCAL_RANK=0
PMI_LOCAL_SIZE=1
)");
  env_.set("PBS_NODEFILE", nodefile);
  LaunchOptions o;
  std::string line = fill(o);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "x1001c0s0b0n0");
  EXPECT_GE(o.master_port, 20000);
  EXPECT_TRUE(testing::contains(line, "Cray PALS")) << line;
}

TEST_F(JobNodesEnv, PbsBatchScriptOfAMultiNodeJobIsRefused) {
  std::string nodefile = testing::scratch_dir("job_nodes_pbs_batch") + "/nodefile";
  std::ofstream(nodefile) << "dec0101\ndec0102\n";
  env_.set("PBS_JOBID", "77.desched1");
  env_.set("PBS_NODEFILE", nodefile);
  LaunchOptions o;
  try {
    fill(o);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "mpiexec -n 2 --ppn 1")) << e.what();
  }
}

TEST_F(JobNodesEnv, OutsideAJobOrWithStandaloneNothingChanges) {
  LaunchOptions o;
  EXPECT_EQ(fill(o), "");
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_port, 29500);
  slurm_one_task_per_node(2);
  LaunchOptions s;
  s.standalone = true;
  EXPECT_EQ(fill(s), "");
  EXPECT_EQ(s.nnodes, 1);
  env_.set("RANK", "0");  // inside a launched worker: not a job's launcher
  LaunchOptions w;
  EXPECT_EQ(fill(w), "");
  EXPECT_EQ(w.nnodes, 1);
}

}  // namespace
}  // namespace dtorch::launch
