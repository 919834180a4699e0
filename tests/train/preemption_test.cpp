// Note [Checkpoint on a signal]: the step the ranks agree to stop after, and the record of an
// epoch's progress a checkpoint taken inside it keeps.
#include "dtorch/train/preemption.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>

#include "dtorch/core/error.h"
#include "dtorch/train/resume.h"

namespace dtorch::train {
namespace {

TEST(Preemption, TheProposalLeavesEveryRankTimeToHearOfIt) {
  // One step for a rank ahead, the steps of two looks, one more.
  EXPECT_EQ(proposed_stop(100, 1.0, 0.5), 100 + 1 + 1 + 1);
  EXPECT_EQ(proposed_stop(100, 0.01, 0.5), 100 + 1 + 100 + 1);
  EXPECT_EQ(proposed_stop(7, 0.3, 0.5), 7 + 1 + 4 + 1);
  EXPECT_EQ(proposed_stop(1, 0, 0.5), 1 + 1 + 1000000 + 1);  // capped, never overflows
}

// Two ranks of one job on one store: the one that gets the signal proposes, the other learns
// the step by looking, and both stop after it, not before.
TEST(Preemption, RanksAgreeOnOneStepThroughTheStore) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Preemption got(launch::CheckpointSignal::Usr1, *store, 0);
  ASSERT_EQ(::raise(SIGUSR1), 0);  // handled: the process goes on
  EXPECT_FALSE(got.stop_after(9));
  EXPECT_FALSE(got.agreed().has_value()) << "proposed before a step was timed";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.stop_after(10));
  ASSERT_TRUE(got.agreed().has_value());
  const int64_t stop = *got.agreed();
  EXPECT_GT(stop, 11);
  Preemption other(launch::CheckpointSignal::Off, *store, 1);
  EXPECT_FALSE(other.stop_after(11)) << "a rank that watches no signal never stops";
  for (int64_t s = 11; s < stop; ++s)
    EXPECT_FALSE(got.stop_after(s));
  EXPECT_TRUE(got.stop_after(stop));
}

TEST(Preemption, ARankThatDidNotGetTheSignalLearnsTheStepByLooking) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string step = "42";
  store->set("dtorch/checkpoint-signal/stop-after", std::vector<uint8_t>(step.begin(), step.end()));
  // Constructed after another rank's proposal; its handler never ran. (A signal that arrived
  // in an earlier test of this process was cleared by the constructor.)
  Preemption rank(launch::CheckpointSignal::Usr2, *store, 3);
  EXPECT_FALSE(rank.stop_after(30));  // looked less than 0.5 s ago
  std::this_thread::sleep_for(std::chrono::milliseconds(550));
  EXPECT_FALSE(rank.stop_after(31));
  EXPECT_EQ(rank.agreed(), 42);
  EXPECT_TRUE(rank.stop_after(42));
  try {
    rank.stop_after(43);
    ADD_FAILURE() << "a rank past the agreed step went on";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("which it has passed"), std::string::npos) << e.what();
  }
}

TEST(Preemption, AnEpochsProgressRoundTripsThroughTheMetadata) {
  LossTally tally;
  tally.add(torch::scalar_tensor(0.5, torch::kDouble), 64);
  tally.add(torch::scalar_tensor(0.25, torch::kDouble), 64);
  const std::string meta = with_epoch_progress(R"({"model": "mnist-cnn"})", {2, tally});
  const EpochProgress back = epoch_progress_of(meta, "ck");
  EXPECT_EQ(back.batches, 2);
  EXPECT_EQ(back.tally.sum(), 0.75);
  EXPECT_EQ(back.tally.batches, 2);
  EXPECT_EQ(back.tally.samples, 128);
  EXPECT_EQ(epoch_progress_of(R"({"model": "mnist-cnn"})", "ck").batches, 0);
  try {
    epoch_progress_of(R"({"epoch_progress": {"batches": -3}})", "ck.dtc");
    ADD_FAILURE() << "read a malformed record";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ck.dtc: its record of the epoch it stopped in"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtorch::train
