// The launchers' node rendezvous on an in-memory store: all nodes present, a missing node named
// by rank after the timeout, and the message's wording.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>

#include "dtorch/core/error.h"
#include "dtorch/launch/node_rendezvous.h"

namespace dtorch::launch {
namespace {

using std::chrono::milliseconds;

TEST(NodeRendezvous, AllNodesMeetAndSeeEachOthersHosts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(200));
    meet_nodes(*store, 1, 2, "hostB", milliseconds(5000));
  });
  NodeRoll roll = meet_nodes(*store, 0, 2, "hostA", milliseconds(5000));
  late.join();
  EXPECT_EQ(roll.hosts, (std::vector<std::string>{"hostA", "hostB"}));
  EXPECT_TRUE(roll.missing().empty());
}

TEST(NodeRendezvous, MissingNodesAreNamedByRankAfterTheTimeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Node 2 came and gave up (its launcher fails the same way).
  EXPECT_THROW(meet_nodes(*store, 2, 4, "hostC", milliseconds(1)), CommError);
  auto t0 = std::chrono::steady_clock::now();
  try {
    meet_nodes(*store, 0, 4, "hostA", milliseconds(300));
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(300));
    EXPECT_NE(std::string(e.what()).find(
                  "rendezvous failed after 0.3 s (--rdzv-timeout): 2 of 4 node(s) arrived (node 0 "
                  "on hostA, node 2 on hostC); missing node rank(s): 1, 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(NodeRendezvous, DescribesARollWithNobody) {
  NodeRoll roll{2, {"", ""}};
  EXPECT_EQ(describe_missing_nodes(roll), "0 of 2 node(s) arrived; missing node rank(s): 0, 1");
  EXPECT_EQ(roll.missing(), (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace dtorch::launch
