// Process groups (Note [Process groups]): a split communicator numbers its own ranks, runs
// every collective among its members only, counts its own traffic (and what crosses nodes),
// takes shared memory when its members share a node even though the job spans nodes, knows
// each member's node, and names a dead member by its job rank and its rank in the group.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

using testing::read_file;

// Four ranks presented as two nodes of two (LOCAL_WORLD_SIZE=2, GROUP_RANK=rank/2), so the job
// itself cannot use shared memory; "pair" groups {0,1}, {2,3} lie within a node, "cross"
// groups {0,2}, {1,3} across nodes.
std::shared_ptr<Communicator> two_nodes_of_two() {
  const int r = std::stoi(std::getenv("RANK"));
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", std::to_string(r % 2).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(r / 2).c_str(), 1);
  return Communicator::from_env();
}

DTORCH_TEST_WORKER(pg_groups) {
  auto world = two_nodes_of_two();
  const int r = world->rank();
  auto pair = world->split({r / 2 * 2, r / 2 * 2 + 1}, "pair");
  auto cross = world->split({r % 2, r % 2 + 2}, "cross");
  std::ostringstream out;
  out << "ranks " << pair->rank() << cross->rank() << " sizes " << pair->size() << cross->size()
      << " global " << pair->global_rank() << cross->global_rank(1) << "\n";
  out << "shm " << world->uses_shared_memory() << pair->uses_shared_memory()
      << cross->uses_shared_memory() << "\n";
  out << "named " << cross->describe_rank(1) << "\n";
  out << "nodes " << world->node_of(0) << world->node_of(1) << world->node_of(2)
      << world->node_of(3) << " " << cross->node_of(1) << "\n";

  // Interleaved async collectives on both groups.
  world->reset_traffic();
  auto a = torch::full({1000}, float(r + 1)), b = torch::full({1000}, float(10 * (r + 1)));
  auto wa = pair->allreduce_async(a), wb = cross->allreduce_async(b);
  wb.wait();
  wa.wait();
  out << "allreduce " << a[0].item<float>() << " " << b[0].item<float>() << "\n";
  // reduce-scatter and allgather within the pair
  auto in = torch::arange(4, torch::kFloat) + r, rs = torch::empty({2});
  pair->reduce_scatter(in, rs);
  auto full = torch::empty({4});
  cross->allgather_into(full, torch::full({2}, float(r)));
  out << "rs " << rs[0].item<float>() << " ag " << full[0].item<float>() << full[2].item<float>()
      << "\n";
  out << "string " << cross->broadcast_string("from " + std::to_string(r), 1) << "\n";
  // Point-to-point in group numbering: cross rank 0 sends to cross rank 1.
  auto msg = torch::full({3}, float(r));
  if (cross->rank() == 0) {
    auto w = cross->isend(msg, 1, 5);
    w.wait();
  } else {
    auto w = cross->irecv(msg, 0, 5);
    w.wait();
  }
  out << "p2p " << msg[0].item<float>() << "\n";
  // Each communicator counts its own bytes: the pair's 4 KB allreduce moves 4000 bytes (2
  // ranks: 2 (N-1)/N of the tensor); the job's communicator moved nothing.
  out << "traffic " << pair->traffic().allreduce << " " << world->traffic().total() << " "
      << pair->traffic().cross_node << "\n";
  // Note [Traffic across nodes]: the job's ring 0 1 | 2 3 crosses from 1 to 2 and from 3 to 0,
  // each rank sending 2 (N-1)/N of 4000 bytes; all the cross group's bytes cross.
  auto w = torch::ones({1000});
  world->allreduce(w);
  out << "across " << world->traffic().cross_node << " of " << world->traffic().total() << " "
      << cross->traffic().total() - cross->traffic().cross_node << "\n";
  std::ofstream(args.at(0) + "/rank" + std::to_string(r)) << out.str();
}

TEST(ProcessGroup, SplitGroupsRunCollectivesAmongTheirMembers) {
  std::string dir = testing::scratch_dir("pg_groups");
  ASSERT_EQ(testing::run_ranks(4, "pg_groups", {dir}), 0);
  for (int r = 0; r < 4; ++r) {
    const int pair_sum = (r / 2 * 2 + 1) + (r / 2 * 2 + 2);
    const int cross_sum = 10 * ((r % 2 + 1) + (r % 2 + 3));
    const int pair0 = r / 2 * 2, cross0 = r % 2;
    // reduce-scatter of arange(4) + q over the pair: chunk i sums (i + q)
    const int rs = (r % 2) * 2 * 2 + pair0 + pair0 + 1;
    std::ostringstream want;
    want << "ranks " << r % 2 << r / 2 << " sizes 22 global " << r << cross0 + 2 << "\n"
         << "shm 010\n"
         << "named " << cross0 + 2 << " (cross rank 1)\n"
         << "nodes 0011 1\n"
         << "allreduce " << pair_sum << " " << cross_sum << "\n"
         << "rs " << rs << " ag " << cross0 << cross0 + 2 << "\n"
         << "string from " << cross0 + 2 << "\n"
         << "p2p " << cross0 << "\n"
         << "traffic 4000 0 0\n"
         << "across " << (r % 2 ? 6000 : 0) << " of 6000 "
         << "0\n";
    EXPECT_EQ(read_file(dir + "/rank" + std::to_string(r)), want.str()) << "rank " << r;
  }
}

// Job rank 3 (rank 1 of its pair) dies while job rank 2 waits for it in the pair's allreduce;
// ranks 0 and 1 run their own pair's collective and finish.
DTORCH_TEST_WORKER(pg_dead_member) {
  setenv("DTORCH_TIMEOUT", "10", 1);
  auto world = Communicator::from_env();
  const int r = world->rank();
  auto pair = world->split({r / 2 * 2, r / 2 * 2 + 1}, "pair");
  if (r == 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    _exit(0);
  }
  auto t = torch::ones({8});
  try {
    pair->allreduce(t, ReduceOp::Sum, "pair sum");
  } catch (const CommError& e) {
    std::ofstream(args.at(0) + "/error") << e.what();
    throw;
  }
}

TEST(ProcessGroup, DeadMemberIsNamedByJobRankAndGroupRank) {
  std::string dir = testing::scratch_dir("pg_dead");
  EXPECT_NE(testing::run_ranks(4, "pg_dead_member", {dir}, 60), 0);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("rank 2 (pair rank 0): allreduce #1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank(s) 3 (pair rank 1)"), std::string::npos) << msg;
}

TEST(ProcessGroup, BadSplitsAreConfigErrors) {
  auto c = Communicator::create(launch::RankInfo{});
  EXPECT_THROW(c->split({1}, "x"), ConfigError);     // not a rank of a world of one
  EXPECT_THROW(c->split({0}, "a/b"), ConfigError);   // '/' in the name
  EXPECT_THROW(c->split({0, 0}, "x"), ConfigError);  // repeated rank
  auto g = c->split({0}, "solo");
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->describe_rank(0), "0 (solo rank 0)");
  auto t = torch::ones({2});
  g->allreduce(t);
  EXPECT_TRUE(t.equal(torch::ones({2})));
}

}  // namespace
}  // namespace dtorch::comm
