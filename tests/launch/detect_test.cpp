// The launch environment detectors on recorded environments: a real srun step and mpirun run
// here (slurm-wlm 22.05, Open MPI 4.1), multi-node Slurm and PBS/PALS jobs written the way those
// systems write them, and the precedence and conflict rules of Note [Launch environment
// precedence].
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "dtorch/core/error.h"
#include "dtorch/launch/detect.h"
#include "dtorch/launch/rank_info.h"
#include "launch/scoped_env.h"
#include "support/command.h"
#include "support/error_of.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

// Task 1 of `srun -n 3` in `sbatch -n 3 --ntasks-per-node=3` on this machine's test cluster.
const char* const kSrunTask1of3 = R"(SLURMD_NODENAME=localhost
SLURM_CLUSTER_NAME=dtorchtest
SLURM_CPUS_ON_NODE=3
SLURM_DISTRIBUTION=block
SLURM_GTIDS=0,1,2
SLURM_JOBID=1
SLURM_JOB_CPUS_PER_NODE=3
SLURM_JOB_ID=1
SLURM_JOB_NAME=job.sh
SLURM_JOB_NODELIST=localhost
SLURM_JOB_NUM_NODES=1
SLURM_LAUNCH_NODE_IPADDR=127.0.0.1
SLURM_LOCALID=1
SLURM_NNODES=1
SLURM_NODEID=0
SLURM_NODELIST=localhost
SLURM_NPROCS=3
SLURM_NTASKS=3
SLURM_NTASKS_PER_NODE=3
SLURM_PROCID=1
SLURM_STEPID=0
SLURM_STEP_ID=0
SLURM_STEP_NODELIST=localhost
SLURM_STEP_NUM_NODES=1
SLURM_STEP_NUM_TASKS=3
SLURM_STEP_TASKS_PER_NODE=3
SLURM_TASKS_PER_NODE=3
SLURM_TASK_PID=31929
)";

// The last task of `sbatch -N 4 -n 7` (srun's block layout puts 2,2,2,1 tasks on the nodes).
const char* const kSrunLastOf7on4 = R"(SLURM_JOB_ID=81234
SLURM_JOB_NODELIST=gpu[01-03,07]
SLURM_JOB_NUM_NODES=4
SLURM_NNODES=4
SLURM_NTASKS=7
SLURM_NPROCS=7
SLURM_TASKS_PER_NODE=2(x3),1
SLURM_STEP_ID=0
SLURM_STEP_NODELIST=gpu[01-03,07]
SLURM_STEP_NUM_NODES=4
SLURM_STEP_NUM_TASKS=7
SLURM_STEP_TASKS_PER_NODE=2(x3),1
SLURM_PROCID=6
SLURM_LOCALID=0
SLURM_NODEID=3
SLURMD_NODENAME=gpu07
)";

// Rank 1 of `mpirun -np 2` on this machine (Open MPI 4.1.4).
const char* const kMpirunRank1of2 = R"(OMPI_COMMAND=bash
OMPI_COMM_WORLD_LOCAL_RANK=1
OMPI_COMM_WORLD_LOCAL_SIZE=2
OMPI_COMM_WORLD_NODE_RANK=1
OMPI_COMM_WORLD_RANK=1
OMPI_COMM_WORLD_SIZE=2
OMPI_FIRST_RANKS=0
OMPI_MCA_ess=^singleton
OMPI_MCA_ess_base_jobid=300285953
OMPI_MCA_ess_base_vpid=1
OMPI_MCA_orte_ess_node_rank=1
OMPI_MCA_orte_ess_num_procs=2
OMPI_UNIVERSE_SIZE=2
PMIX_NAMESPACE=300285953
PMIX_RANK=1
)";

// Rank 5 of `mpiexec -n 8 --ppn 4` (Cray PALS) in a 2-node PBS job on Derecho.
const char* const kPalsRank5of8 = R"(PBS_JOBID=4123456.desched1
PBS_O_WORKDIR=/glade/u/home/user/run
PBS_ENVIRONMENT=PBS_BATCH
PALS_APID=7a3c1f02-5f4e-4b87-9a0c-2d3c5e6f7a81
PALS_RANKID=5
PALS_LOCAL_RANKID=1
PALS_NODEID=1
PALS_LOCAL_SIZE=4
PALS_DEPTH=16
PMI_RANK=5
PMI_SIZE=8
PMI_LOCAL_RANK=1
PMI_LOCAL_SIZE=4
PMI_UNIVERSE_SIZE=8
)";

class DetectEnv : public ::testing::Test {
 protected:
  // A PBS node file as PBS writes it for `select=2:ncpus=64:mpiprocs=4`: one line per MPI slot.
  std::string write_nodefile() {
    std::string path = testing::scratch_dir("pbs_nodefile") + "/nodefile";
    std::ofstream f(path);
    for (const char* h : {"dec0101", "dec0102"})
      for (int i = 0; i < 4; ++i)
        f << h << ".hsn.de.hpc.ucar.edu\n";
    return path;
  }
  dtorch::testing::ScopedEnv env_;
};

TEST_F(DetectEnv, SlurmTaskFromARecordedStep) {
  env_.load(kSrunTask1of3);
  auto d = detect_slurm();
  ASSERT_TRUE(d);
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 3);
  EXPECT_EQ(r.node_rank, 0);
  EXPECT_EQ(r.nnodes, 1);
  EXPECT_EQ(r.master_addr, "127.0.0.1");  // one node: loopback, whatever the host is called
  EXPECT_EQ(r.master_port, 20001);        // 20000 + SLURM_JOB_ID 1
  EXPECT_FALSE(r.launcher_hosts_store);   // rank 0 serves the store
}

TEST_F(DetectEnv, SlurmMultiNodeUsesTheFirstHostAndTasksPerNode) {
  env_.load(kSrunLastOf7on4);
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 6);
  EXPECT_EQ(r.world_size, 7);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 1);  // the last entry of 2(x3),1
  EXPECT_EQ(r.node_rank, 3);
  EXPECT_EQ(r.nnodes, 4);
  EXPECT_EQ(r.master_addr, "gpu01");
  EXPECT_EQ(r.master_port, 21234);  // 20000 + 81234 % 10000
  // A node in the middle has two tasks.
  env_.set("SLURM_PROCID", "3");
  env_.set("SLURM_LOCALID", "1");
  env_.set("SLURM_NODEID", "1");
  r = rank_info_from_env();
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.local_rank, 1);
}

TEST_F(DetectEnv, SlurmMasterAddrAndPortOverride) {
  env_.load(kSrunLastOf7on4);
  env_.set("MASTER_ADDR", "gpu03-ib");
  env_.set("MASTER_PORT", "31000");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.master_addr, "gpu03-ib");
  EXPECT_EQ(r.master_port, 31000);
}

TEST_F(DetectEnv, SlurmUniformTasksPerNodeWithoutAList) {
  env_.load(kSrunLastOf7on4);
  for (const char* v : {"SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"})
    env_.unset(v);
  env_.set("SLURM_NTASKS_PER_NODE", "2");
  env_.set("SLURM_NTASKS", "8");
  env_.set("SLURM_STEP_NUM_TASKS", "8");
  env_.set("SLURM_PROCID", "7");
  env_.set("SLURM_LOCALID", "1");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.local_rank, 1);
}

TEST_F(DetectEnv, SlurmBatchScriptIsOneProcess) {
  env_.load(kSrunTask1of3);
  for (const char* v : {"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS",
                        "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE"})
    env_.unset(v);
  env_.set("SLURM_PROCID", "0");
  env_.set("SLURM_LOCALID", "0");
  EXPECT_FALSE(detect_slurm());
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.rank, 0);
}

TEST_F(DetectEnv, SlurmPartialStepNamesTheVariables) {
  env_.load(kSrunTask1of3);
  env_.unset("SLURM_NTASKS");
  env_.unset("SLURM_STEP_NUM_TASKS");
  env_.unset("SLURM_NPROCS");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "SLURM_NTASKS=-1")) << msg;
  EXPECT_TRUE(testing::contains(msg, "srun")) << msg;
}

TEST_F(DetectEnv, SlurmTasksPerNodeDisagreeingWithNtasksIsAnError) {
  env_.load(kSrunLastOf7on4);
  env_.set("SLURM_STEP_NUM_TASKS", "8");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "SLURM_STEP_TASKS_PER_NODE=2(x3),1")) << msg;
  EXPECT_TRUE(testing::contains(msg, "SLURM_STEP_NUM_TASKS=8")) << msg;
}

TEST_F(DetectEnv, SlurmIdsOutsideTheirRangeAreErrors) {
  env_.load(kSrunLastOf7on4);
  env_.set("SLURM_LOCALID", "1");  // node 3 has one task
  EXPECT_TRUE(
      testing::contains(testing::error_of([] { rank_info_from_env(); }), "SLURM_LOCALID=1"));
  env_.set("SLURM_LOCALID", "0");
  env_.set("SLURM_NODEID", "4");
  EXPECT_TRUE(testing::contains(testing::error_of([] { rank_info_from_env(); }), "SLURM_NODEID=4"));
  env_.set("SLURM_NODEID", "3");
  env_.set("SLURM_PROCID", "7");
  EXPECT_TRUE(testing::contains(testing::error_of([] { rank_info_from_env(); }), "SLURM_PROCID=7"));
}

TEST_F(DetectEnv, OpenMpiFromARecordedMpirun) {
  env_.load(kMpirunRank1of2);
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.nnodes, 1);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_EQ(r.master_port, 20000 + 300285953 % 10000);  // from this mpirun's job id
}

TEST_F(DetectEnv, OpenMpiOnManyNodesNeedsMasterAddr) {
  env_.load(kMpirunRank1of2);
  env_.set("OMPI_COMM_WORLD_SIZE", "4");
  env_.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "export MASTER_ADDR")) << msg;
  env_.set("MASTER_ADDR", "node7");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.master_addr, "node7");
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.node_rank, 0);
}

// mpirun inside `salloc -N 2`: the ranks are Open MPI's, node 0 is the allocation's first host.
TEST_F(DetectEnv, OpenMpiInsideASlurmAllocationUsesItsFirstHost) {
  env_.load(kMpirunRank1of2);
  env_.set("OMPI_COMM_WORLD_RANK", "3");
  env_.set("OMPI_COMM_WORLD_SIZE", "4");
  env_.set("SLURM_JOB_ID", "777");
  env_.set("SLURM_JOB_NODELIST", "cn[101-102]");
  env_.set("SLURM_JOB_NUM_NODES", "2");
  env_.set("SLURM_NTASKS", "4");
  env_.set("SLURM_PROCID", "0");  // the salloc shell's, inherited through mpirun
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.master_addr, "cn101");
  EXPECT_EQ(r.master_port, 20000 + 300285953 % 10000);  // mpirun's id beats the job's
}

TEST_F(DetectEnv, OpenMpiPartialSetIsAnError) {
  env_.set("OMPI_COMM_WORLD_RANK", "1");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "OMPI_COMM_WORLD_SIZE")) << msg;
}

TEST_F(DetectEnv, PmiFromHydraMpiexec) {
  env_.set("PMI_RANK", "2");
  env_.set("PMI_SIZE", "4");
  env_.set("MPI_LOCALRANKID", "0");
  env_.set("MPI_LOCALNRANKS", "2");
  env_.set("MASTER_ADDR", "head");
  env_.set("MASTER_PORT", "29999");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.master_addr, "head");
  EXPECT_EQ(r.master_port, 29999);
}

// srun --mpi=pmi2 adds PMI_RANK/PMI_SIZE but no local ranks: Slurm's fill them in.
TEST_F(DetectEnv, PmiFromSrunTakesLocalRanksFromSlurm) {
  env_.load(kSrunLastOf7on4);
  env_.set("PMI_RANK", "6");
  env_.set("PMI_SIZE", "7");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 6);
  EXPECT_EQ(r.node_rank, 3);
  EXPECT_EQ(r.local_world_size, 1);
  EXPECT_EQ(r.nnodes, 4);
  EXPECT_EQ(r.master_addr, "gpu01");
}

TEST_F(DetectEnv, PalsUnderPbsUsesTheNodeFile) {
  env_.load(kPalsRank5of8);
  env_.set("PBS_NODEFILE", write_nodefile());
  auto job = pbs_allocation();
  ASSERT_TRUE(job);
  EXPECT_EQ(job->hosts, (std::vector<std::string>{"dec0101.hsn.de.hpc.ucar.edu",
                                                  "dec0102.hsn.de.hpc.ucar.edu"}));
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.master_addr, "dec0101.hsn.de.hpc.ucar.edu");
  // The port comes from this mpiexec's application id: the same for every rank, not the
  // PBS job's (two mpiexecs in one job must not share it).
  int port = r.master_port;
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 30000);
  env_.set("PALS_RANKID", "0");
  env_.set("PALS_LOCAL_RANKID", "0");
  env_.set("PALS_NODEID", "0");
  EXPECT_EQ(rank_info_from_env().master_port, port);
  env_.unset("PALS_APID");
  EXPECT_EQ(rank_info_from_env().master_port, 23456);  // 20000 + PBS job 4123456 % 10000
}

TEST_F(DetectEnv, PalsWithoutPmiSizeIsAnError) {
  env_.load(kPalsRank5of8);
  env_.unset("PMI_SIZE");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "PMI_SIZE")) << msg;
}

TEST_F(DetectEnv, UnreadableNodeFileIsAnError) {
  env_.load(kPalsRank5of8);
  env_.set("PBS_NODEFILE", "/nonexistent/aux/4123456.desched1");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "PBS_NODEFILE=/nonexistent")) << msg;
}

TEST_F(DetectEnv, PbsBatchScriptIsOneProcess) {
  env_.set("PBS_JOBID", "4123456.desched1");
  env_.set("PBS_NODEFILE", write_nodefile());
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.world_size, 1);
}

// `dtorch launch` in a one-task-per-node step: its workers' torchrun variables win.
TEST_F(DetectEnv, LauncherVariablesWinOverSlurm) {
  env_.load(kSrunLastOf7on4);
  for (auto [k, v] : {std::pair{"RANK", "5"},
                      {"WORLD_SIZE", "16"},
                      {"LOCAL_RANK", "1"},
                      {"LOCAL_WORLD_SIZE", "4"},
                      {"GROUP_RANK", "1"},
                      {"MASTER_ADDR", "gpu01"},
                      {"MASTER_PORT", "21234"},
                      {"TORCHELASTIC_RUN_ID", "none"}})
    env_.set(k, v);
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 16);
  EXPECT_EQ(r.node_rank, 1);
  // Even when the world sizes happen to match, a launcher's ranks are not compared.
  env_.set("WORLD_SIZE", "7");
  env_.set("LOCAL_WORLD_SIZE", "2");
  EXPECT_EQ(rank_info_from_env().rank, 5);
}

// `export RANK=$SLURM_PROCID` in the batch script gives every task RANK=0.
TEST_F(DetectEnv, HandExportedRankMustMatchSlurm) {
  env_.load(kSrunLastOf7on4);
  env_.set("RANK", "0");
  env_.set("WORLD_SIZE", "7");
  env_.set("MASTER_PORT", "29500");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "RANK=0 but SLURM_PROCID=6")) << msg;
  env_.set("RANK", "6");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 6);
  EXPECT_EQ(r.master_addr, "127.0.0.1");  // torchrun's rules once RANK is set
}

TEST_F(DetectEnv, HandExportedRankMustMatchOpenMpi) {
  env_.load(kMpirunRank1of2);
  env_.set("RANK", "0");
  env_.set("WORLD_SIZE", "2");
  env_.set("MASTER_PORT", "29500");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "RANK=0 but OMPI_COMM_WORLD_RANK=1")) << msg;
}

// A hand-written launcher in each Slurm task runs more ranks than Slurm has tasks.
TEST_F(DetectEnv, TorchrunWithALargerWorldThanSlurmIsNotCompared) {
  env_.load(kSrunLastOf7on4);
  env_.set("RANK", "0");
  env_.set("WORLD_SIZE", "28");
  env_.set("MASTER_PORT", "29500");
  EXPECT_EQ(rank_info_from_env().world_size, 28);
}

TEST_F(DetectEnv, WorldSizeAloneMustMatchTheScheduler) {
  env_.load(kSrunLastOf7on4);
  env_.set("WORLD_SIZE", "8");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_TRUE(testing::contains(msg, "WORLD_SIZE=8 but SLURM_STEP_NUM_TASKS=7")) << msg;
  env_.set("WORLD_SIZE", "7");
  EXPECT_EQ(rank_info_from_env().rank, 6);
}

// mpirun inside a Slurm step: the MPI ranks are this process's, Slurm's describe mpirun.
TEST_F(DetectEnv, MpiWinsOverSlurm) {
  env_.load(kSrunTask1of3);
  env_.load(kMpirunRank1of2);
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(detect_scheduler()->source, "Open MPI");
}

TEST_F(DetectEnv, PortFromJobId) {
  EXPECT_EQ(port_from_job_id("42"), 20042);
  EXPECT_EQ(port_from_job_id("81234"), 21234);
  EXPECT_EQ(port_from_job_id("4123456.desched1"), 23456);
  int a = port_from_job_id("7a3c1f02-5f4e"), b = port_from_job_id("7a3c1f02-5f4f");
  EXPECT_EQ(a, port_from_job_id("7a3c1f02-5f4e"));
  EXPECT_NE(a, b);
  EXPECT_GE(a, 20000);
  EXPECT_LT(a, 30000);
}

}  // namespace
}  // namespace dtorch::launch
