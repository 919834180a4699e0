// rank_info_from_env: torchrun's variables in, RankInfo out, and partial or inconsistent sets
// rejected with the variables named. Sets and restores the real environment in-process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dtorch/core/error.h"
#include "dtorch/launch/rank_info.h"
#include "launch/scoped_env.h"
#include "support/error_of.h"

namespace dtorch::launch {
namespace {

// Each test starts from an environment without any launcher's variables and gets the original
// back afterwards, so a test run under `dtorch launch`, torchrun, srun or mpirun still passes.
class RankInfoEnv : public ::testing::Test {
 protected:
  static void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  dtorch::testing::ScopedEnv env_;
};

TEST_F(RankInfoEnv, NothingSetIsOneProcess) {
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 1);
  EXPECT_EQ(r.nnodes, 1);
  EXPECT_FALSE(r.launcher_hosts_store);
}

TEST_F(RankInfoEnv, ReadsTorchrunVariables) {
  set("RANK", "5");
  set("LOCAL_RANK", "1");
  set("WORLD_SIZE", "8");
  set("LOCAL_WORLD_SIZE", "4");
  set("GROUP_RANK", "1");
  set("MASTER_ADDR", "node0.example");
  set("MASTER_PORT", "29511");
  set("TORCHELASTIC_RESTART_COUNT", "2");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_EQ(r.nnodes, 2);
  EXPECT_EQ(r.master_addr, "node0.example");
  EXPECT_EQ(r.master_port, 29511);
  EXPECT_EQ(r.restart_count, 2);
  EXPECT_TRUE(r.launcher_hosts_store);
}

TEST_F(RankInfoEnv, NodeRankDefaultsFromRankAndLocalWorld) {
  set("RANK", "6");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "2");
  set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_PORT", "29500");
  RankInfo r = rank_info_from_env();
  EXPECT_EQ(r.node_rank, 1);
  EXPECT_FALSE(r.launcher_hosts_store);  // plain torchrun-less start: rank 0 serves the store
}

TEST_F(RankInfoEnv, RankWithoutWorldSizeNamesBoth) {
  set("RANK", "1");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_NE(msg.find("RANK"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WORLD_SIZE"), std::string::npos) << msg;
}

TEST_F(RankInfoEnv, WorldSizeWithoutRankIsAnError) {
  set("WORLD_SIZE", "2");
  EXPECT_NE(testing::error_of([] { rank_info_from_env(); }), "(no error)");
}

TEST_F(RankInfoEnv, RankOutsideWorldIsAnError) {
  set("RANK", "2");
  set("WORLD_SIZE", "2");
  set("MASTER_PORT", "29500");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_NE(msg.find("RANK=2"), std::string::npos) << msg;
}

TEST_F(RankInfoEnv, MissingMasterPortForManyRanksIsAnError) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_NE(msg.find("MASTER_PORT"), std::string::npos) << msg;
}

TEST_F(RankInfoEnv, MalformedNumberNamesTheVariable) {
  set("RANK", "zero");
  set("WORLD_SIZE", "2");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_NE(msg.find("RANK"), std::string::npos) << msg;
}

TEST_F(RankInfoEnv, LocalRankMustFitLocalWorld) {
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_PORT", "29500");
  std::string msg = testing::error_of([] { rank_info_from_env(); });
  EXPECT_NE(msg.find("LOCAL_RANK=3"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dtorch::launch
