// Pipeline schedules on paper (Note [Schedules as data]): every send meets its receive in
// order, the bubble is the known (p-1)/(m+p-1) for GPipe and 1F1B, divided by v for
// interleaved 1F1B, a third of 1F1B's for ZB-H1; 1F1B holds at most p micro-batches of
// activations where GPipe holds m, ZB-H1 no more than 1F1B's largest; broken schedules are
// named.
#include "dtorch/parallel/pp/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "dtorch/core/error.h"
#include "support/error_of.h"

namespace dtorch::pp {
namespace {

struct Shape {
  int stages, microbatches;
};

class Schedules : public ::testing::TestWithParam<Shape> {};

TEST_P(Schedules, BubbleIsTheKnownFormula) {
  const auto [p, m] = GetParam();
  for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
    Simulation sim = simulate(s, m);
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

TEST_P(Schedules, ZeroBubbleCutsTheBubbleToAThirdAtOneFOneBsPeakMemory) {
  const auto [p, m] = GetParam();
  Simulation z = simulate(zero_bubble_h1(p, m), m);
  // Equal F, B and W times: 1F1B idles (p-1)(F+B+W) per rank, ZB-H1 (p-1)(F+B-W) = p-1
  // (Qi et al. 2023), once there are at least as many micro-batches as stages.
  if (m >= p) {
    EXPECT_DOUBLE_EQ(z.makespan, 3.0 * m + p - 1);
    for (int r = 0; r < p; ++r)
      EXPECT_NEAR(z.idle_fraction[r], double(p - 1) / (3 * m + p - 1), 1e-12) << "rank " << r;
  }
  Simulation f = simulate(one_f_one_b(p, m), m);
  EXPECT_LE(z.makespan, f.makespan);
  const int one_f_one_b_peak =
      *std::max_element(f.peak_activations.begin(), f.peak_activations.end());
  for (int r = 0; r < p; ++r)
    EXPECT_LE(z.peak_activations[r], one_f_one_b_peak) << "rank " << r;
  // Rank r holds up to r + 1 micro-batches whose weight halves wait, each with its recorded
  // gradients (Note [Split backward]); 1F1B runs each backward whole.
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(z.peak_awaiting_weights[r], std::min(r + 1, m)) << "rank " << r;
    EXPECT_EQ(f.peak_awaiting_weights[r], 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Schedules,
                         ::testing::Values(Shape{1, 1}, Shape{2, 4}, Shape{4, 8}, Shape{4, 2},
                                           Shape{8, 32}, Shape{3, 5}));

struct Interleaving {
  int ranks, microbatches, virtual_stages;
};

class Interleaved : public ::testing::TestWithParam<Interleaving> {};

TEST_P(Interleaved, BubbleIsOneFOneBsDividedByTheStagesPerRank) {
  const auto [p, m, v] = GetParam();
  Schedule s = interleaved_one_f_one_b(p, m, v);
  // Each rank runs v stages, so a stage's F and B take 1 and 2 units of their own: the busy
  // time is 3 v m and the idle (p-1) 3 units, the bubble (p-1)/(v m + p - 1) (Narayanan et
  // al. 2021: 1F1B's divided by v).
  Simulation sim = simulate(s, m);
  EXPECT_EQ(sim.stages, p * v);
  EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (v * m + p - 1));
  for (int r = 0; r < p; ++r)
    EXPECT_NEAR(sim.idle_fraction[r], double(p - 1) / (v * m + p - 1), 1e-12) << "rank " << r;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : s[r])
      EXPECT_EQ(rank_of_stage(a.stage, p), r) << to_string(a);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Interleaved,
                         ::testing::Values(Interleaving{2, 2, 2}, Interleaving{2, 4, 2},
                                           Interleaving{4, 8, 2}, Interleaving{4, 8, 3},
                                           Interleaving{4, 16, 4}, Interleaving{3, 6, 2}));

TEST(Schedules, ScheduleNamesAndBadShapesAreConfigErrors) {
  for (const std::string& name : names_of<ScheduleKind>()) {
    const ScheduleKind kind = *value_named<ScheduleKind>(name);
    Schedule s = make_schedule(kind, 2, 4, default_virtual_stages(kind));
    EXPECT_NO_THROW(simulate(s, 4)) << name;
  }
  EXPECT_FALSE(value_named<ScheduleKind>("zigzag"));
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 2, 4, 2), ConfigError);
  EXPECT_THROW(interleaved_one_f_one_b(4, 6, 2), ConfigError);  // 6 not a multiple of 4
  EXPECT_THROW(interleaved_one_f_one_b(1, 4, 2), ConfigError);
}

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
  return testing::error_of([&] { simulate(s, m); });
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
  // A weight gradient before its input gradient.
  Schedule early = zero_bubble_h1(1, 2);  // F0 I0 W0 F1 I1 W1
  std::swap(early[0][1], early[0][2]);
  EXPECT_NE(error_of(early, 2).find("before its input gradient"), std::string::npos)
      << error_of(early, 2);
  EXPECT_THROW(gpipe(0, 4), ConfigError);
}

TEST(Schedules, TimelineShowsTheBubble) {
  Schedule s = gpipe(2, 2);
  std::string t = timeline(s, simulate(s, 2));
  EXPECT_EQ(t,
            "rank 0 |F0 F1 .  .  .  B0 B0 B1 B1 |\n"
            "rank 1 |.  F0 F1 B0 B0 B1 B1 .  .  |\n");
  Schedule z = zero_bubble_h1(2, 2);
  EXPECT_EQ(timeline(z, simulate(z, 2)),
            "rank 0 |F0 F1 .  I0 W0 I1 W1 |\n"
            "rank 1 |.  F0 I0 F1 I1 W0 W1 |\n");
  Schedule i = interleaved_one_f_one_b(2, 2, 2);
  const std::string svg = timeline_picture(i, simulate(i, 2), "interleaved").svg();
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find(">F1b<"), std::string::npos) << svg;
}

}  // namespace
}  // namespace dtorch::pp
