// Pipeline schedules on paper (Note [Schedules as data]): every send meets its receive in
// order, the bubble is the known (p-1)/(m+p-1) for GPipe and 1F1B, 1F1B holds at most p
// micro-batches of activations where GPipe holds m, and broken schedules are named.
#include "dtorch/parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"

namespace dtorch::pp {
namespace {

struct Shape {
  int stages, microbatches;
};

class Schedules : public ::testing::TestWithParam<Shape> {};

TEST_P(Schedules, BubbleIsTheKnownFormula) {
  const auto [p, m] = GetParam();
  for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
    Simulation sim = simulate(s, m, 1.0, 2.0);
    EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1));
    for (int r = 0; r < p; ++r)
      EXPECT_NEAR(sim.idle_fraction[r], double(p - 1) / (m + p - 1), 1e-12) << "rank " << r;
  }
}

TEST_P(Schedules, OneFOneBHoldsAtMostPMicrobatchesGPipeHoldsM) {
  const auto [p, m] = GetParam();
  Simulation g = simulate(gpipe(p, m), m), f = simulate(one_f_one_b(p, m), m);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(g.peak_activations[r], m) << "rank " << r;
    EXPECT_EQ(f.peak_activations[r], std::min(p - r, m)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Schedules,
                         ::testing::Values(Shape{1, 1}, Shape{2, 4}, Shape{4, 8}, Shape{4, 2},
                                           Shape{8, 32}, Shape{3, 5}));

TEST(Schedules, CommunicationSitsNextToTheComputeThatNeedsOrMakesIt) {
  Schedule s = one_f_one_b(2, 2);
  std::vector<std::string> r0, r1;
  for (const auto& a : s[0])
    r0.push_back(to_string(a));
  for (const auto& a : s[1])
    r1.push_back(to_string(a));
  EXPECT_EQ(r0, (std::vector<std::string>{"F0@0", "sA0@0", "F1@0", "sA1@0", "rG0@0", "B0@0",
                                          "rG1@0", "B1@0"}));
  EXPECT_EQ(r1, (std::vector<std::string>{"rA0@1", "F0@1", "B0@1", "sG0@1", "rA1@1", "F1@1", "B1@1",
                                          "sG1@1"}));
}

std::string error_of(const Schedule& s, int m) {
  try {
    simulate(s, m);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Schedules, DeadlocksOrderMismatchesAndMissingWorkAreNamed) {
  // Stage 1 waits for micro-batch 1's gradient before running its own backward of 0... here:
  // rank 1 receives activations 1 then 0 while rank 0 sends 0 then 1.
  Schedule swapped = gpipe(2, 2);
  std::swap(swapped[1][0], swapped[1][2]);  // rA0 <-> rA1
  std::swap(swapped[1][1], swapped[1][3]);  // F0 <-> F1
  EXPECT_NE(error_of(swapped, 2).find("in different orders"), std::string::npos)
      << error_of(swapped, 2);
  // Rank 0 waits for a gradient before sending the activation that would produce it.
  Schedule stuck = gpipe(2, 1);
  std::swap(stuck[0][0], stuck[0][2]);  // rG0 first
  std::swap(stuck[0][1], stuck[0][3]);
  EXPECT_NE(error_of(stuck, 1).find("deadlocks"), std::string::npos) << error_of(stuck, 1);
  Schedule missing = gpipe(2, 2);
  EXPECT_NE(error_of(missing, 3).find("it must run once"), std::string::npos);
  EXPECT_THROW(gpipe(0, 4), ConfigError);
}

TEST(Schedules, TimelineShowsTheBubble) {
  Schedule s = gpipe(2, 2);
  std::string t = timeline(s, simulate(s, 2));
  EXPECT_EQ(t,
            "rank 0 |F0 F1 .  .  .  B0 B0 B1 B1 |\n"
            "rank 1 |.  F0 F1 B0 B0 B1 B1 .  .  |\n");
}

}  // namespace
}  // namespace dtorch::pp
