// How a roll of nodes is named (a static job's rounds meet in elastic_rendezvous_test.cpp), and
// the loop launchers and workers share (Note [Announce and wait]) saying what a long wait waits
// for while it waits.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>

#include "dtorch/core/error.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/store.h"

namespace dtorch::launch {
namespace {

using std::chrono::milliseconds;

TEST(NodeRendezvous, DescribesARollWithNobody) {
  NodeRoll roll{2, {"", ""}};
  EXPECT_EQ(describe_missing_nodes(roll), "0 of 2 node(s) arrived; missing node rank(s): 0, 1");
  EXPECT_EQ(roll.missing(), (std::vector<int>{0, 1}));
}

TEST(AnnounceAndWait, SaysWhoIsMissingWhileItWaitsAndReturnsEveryValue) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(300));
    store->set("p/2", std::vector<uint8_t>{'c'});
  });
  store->set("p/1", std::vector<uint8_t>{'b'});
  std::vector<std::vector<int>> said;
  WaitNotice notice{milliseconds(100), [&](const Arrivals& a, double seconds) {
                      EXPECT_GE(seconds, 0.1 * static_cast<double>(said.size() + 1) - 0.01);
                      said.push_back(a.missing());
                    }};
  Arrivals a;
  EXPECT_TRUE(announce_and_wait(*store, "p/", 0, "a", 3,
                                std::chrono::steady_clock::now() + milliseconds(5000), a, notice));
  late.join();
  EXPECT_EQ(a.values, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(a.complete());
  ASSERT_GE(said.size(), 2u);  // at 0.1 and 0.2 s, not after the last one came
  EXPECT_LE(said.size(), 3u);
  for (const auto& m : said)
    EXPECT_EQ(m, (std::vector<int>{2}));
  // A deadline that passes returns who was missing, for the caller to name.
  Arrivals partial;
  EXPECT_FALSE(announce_and_wait(*store, "q/", 1, "b", 3,
                                 std::chrono::steady_clock::now() + milliseconds(50), partial));
  EXPECT_EQ(partial.missing(), (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace dtorch::launch
