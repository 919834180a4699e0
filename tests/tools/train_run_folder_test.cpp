// Note [One run per folder]: `dtorch train` into a folder that holds another run is refused
// and changes nothing; --overwrite replaces the run and removes the earlier one only after its
// own first checkpoint; a run an --overwrite set aside and never replaced is put back and
// resumed; a failed --resume keeps the folder's config.json; an epoch trained again after a
// failed save is recorded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dtorch/checkpoint/checkpoint.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::read_file;
using testing::run_command;
using testing::with;

std::vector<std::string> run_args(const std::string& out, int epochs, int nproc = 1) {
  return testing::gpt_debug_train_args(out, "ddp", nproc, epochs);
}

// Every file under `dir` (sub-folders included) and its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::error_code ec;
  std::map<std::string, std::string> files;
  for (const std::string& path : paths::list_files_recursively(dir, ec))
    files[path] = read_file(path);
  return files;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

// The "step" of every record in metrics.jsonl, in file order.
std::vector<int64_t> steps_of(const std::string& out, const std::string& kind) {
  std::vector<int64_t> steps;
  for (const auto& j : testing::records_of(out, kind))
    steps.push_back(j["step"].get<int64_t>());
  return steps;
}

TEST(TrainRunFolder, ANewRunIntoAnotherRunsFolderIsRefusedAndChangesNothing) {
  const std::string out = testing::scratch_dir("run_folder_refused") + "/run";
  auto r = run_command("run_folder_first", run_args(out, 2), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const auto before = snapshot(out);
  ASSERT_TRUE(before.count(out + "/checkpoint-000002.dtc"));
  // The same command again, and another seed on two ranks: refused once, before any rank
  // starts, naming what is there and both ways on.
  for (const auto& args : {run_args(out, 2), with(run_args(out, 1, 2), {"--seed", "7"})}) {
    r = run_command("run_folder_again", args, 120);
    EXPECT_NE(r.exit_code(), 0);
    EXPECT_EQ(count_of(r.err, "holds another run"), 1) << r.err;
    EXPECT_TRUE(contains(r.err, "checkpoint-000002.dtc")) << r.err;
    EXPECT_TRUE(contains(r.err, "--resume")) << r.err;
    EXPECT_TRUE(contains(r.err, "--overwrite")) << r.err;
    EXPECT_FALSE(contains(r.err, "[n0 r")) << r.err;
    EXPECT_TRUE(snapshot(out) == before);
  }
  r = run_command("run_folder_both", with(run_args(out, 2), {"--resume", "--overwrite"}), 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "give one")) << r.err;
  // A failed --resume (another model) leaves the folder's record of its run.
  auto other = with(run_args(out, 3), {"--resume"});
  *(std::find(other.begin(), other.end(), "gpt-debug")) = "gpt-long";
  r = run_command("run_folder_bad_resume", other, 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "does not fit this model")) << r.err;
  EXPECT_TRUE(snapshot(out) == before) << r.err;
}

TEST(TrainRunFolder, OverwriteReplacesTheRunOnceItsFirstCheckpointIsWritten) {
  const std::string out = testing::scratch_dir("run_folder_overwrite") + "/run";
  auto r = run_command("run_folder_old", run_args(out, 2), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::ofstream(out + "/notes.txt") << "the user's own";
  r = run_command("run_folder_new", with(run_args(out, 1, 2), {"--overwrite", "--seed", "7"}), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "set aside")) << r.err;
  EXPECT_TRUE(contains(r.err, "removed the run --overwrite replaced")) << r.err;
  // Only the new run's: one epoch, its checkpoint, its seed; the user's file kept.
  EXPECT_EQ(steps_of(out, "epoch").size(), 1u);
  EXPECT_EQ(checkpoint::list_checkpoints(out).size(), 1u);
  EXPECT_FALSE(paths::exists(out + "/checkpoint-000002.dtc"));
  EXPECT_FALSE(paths::exists(out + "/.overwritten"));
  EXPECT_EQ(nlohmann::json::parse(read_file(out + "/config.json"))["training"]["seed"], 7);
  EXPECT_EQ(read_file(out + "/notes.txt"), "the user's own");
}

// What an --overwrite stopped before its first checkpoint leaves (the earlier run in
// .overwritten, the stopped run's config.json and metrics.jsonl beside it): a new run is
// refused, naming it; --resume puts it back and continues it, each epoch recorded once.
TEST(TrainRunFolder, ARunSetAsideAndNeverReplacedIsPutBackAndResumed) {
  const std::string base = testing::scratch_dir("run_folder_put_back");
  const std::string out = base + "/run";
  auto r = run_command("run_folder_whole", run_args(base + "/whole", 3), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  r = run_command("run_folder_two", run_args(out, 2), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  paths::create_directory(out + "/.overwritten");
  for (const std::string& name : paths::list_directory(out))
    if (name != ".overwritten") paths::rename(out + "/" + name, out + "/.overwritten/" + name);
  std::ofstream(out + "/config.json") << "{\"stopped\": true}\n";
  std::ofstream(out + "/metrics.jsonl") << "{\"kind\": \"step\", \"step\": 1}\n";

  r = run_command("run_folder_refused_aside", run_args(out, 3), 120);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, ".overwritten")) << r.err;
  r = run_command("run_folder_resume_aside", with(run_args(out, 3), {"--resume"}), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "put back the run")) << r.err;
  EXPECT_TRUE(contains(r.err, "2 epoch(s) done")) << r.err;
  EXPECT_FALSE(paths::exists(out + "/.overwritten"));
  EXPECT_EQ(steps_of(out, "epoch"), steps_of(base + "/whole", "epoch"));
  auto a = testing::model_file(out + "/model.pt"),
       b = testing::model_file(base + "/whole/model.pt");
  for (const auto& [k, t] : b)
    EXPECT_TRUE(t.equal(a[k])) << k;
}

// A save that failed after its epoch's record (the checkpoint is missing, the record is there,
// with a line cut short after it): the epoch is trained again on --resume and recorded once.
TEST(TrainRunFolder, AnEpochTrainedAgainIsRecordedOnce) {
  const std::string out = testing::scratch_dir("run_folder_once") + "/run";
  auto r = run_command("run_folder_once_two", run_args(out, 2), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::vector<int64_t> epochs = steps_of(out, "epoch");
  ASSERT_EQ(epochs.size(), 2u);
  paths::remove(out + "/checkpoint-000002.dtc");
  std::ofstream(out + "/metrics.jsonl", std::ios::app) << "{\"kind\": \"epo";
  r = run_command("run_folder_once_resume", with(run_args(out, 2), {"--resume"}), 120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "1 epoch(s) done")) << r.err;
  EXPECT_EQ(steps_of(out, "epoch"), epochs);
}

}  // namespace
}  // namespace dtorch
