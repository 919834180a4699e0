// Tests for sharded checkpoints: saved by 4 real ranks and read back at 2 and 1 (resharding),
// keep-last-K, all-ranks-agree failures, and every way a checkpoint can be damaged.
#include "dtorch/checkpoint/sharded_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "checkpoint/sharded_fixture.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/resident.h"
#include "support/workers.h"

namespace dtorch::checkpoint {
namespace {

using testing::even_split;
using testing::toy_checkpoint_copy;
using testing::toy_flat;
using testing::toy_flat_keys;
using testing::toy_full;

// args: DIR STEP. Reads this rank's share (of the new world size) of every flat key, and the
// full tensors, and compares them with the values the saving ranks were given.
DTORCH_TEST_WORKER(sharded_load) {
  auto comm = comm::Communicator::from_env();
  const int64_t step = std::stoll(args.at(1));
  ShardedCheckpointReader reader(args.at(0));
  DTORCH_CHECK(reader.data().global_step == step, "loaded step ", reader.data().global_step);
  DTORCH_CHECK(reader.world_size() == 4, "saved at world size ", reader.world_size());
  int64_t checked = 0;
  for (const auto& [key, numel, dtype] : toy_flat_keys()) {
    auto [b, e] = even_split(numel, comm->size(), comm->rank());
    torch::Tensor got = reader.read_range(key, b, e);
    torch::Tensor want = toy_flat(step, key, numel, dtype).narrow(0, b, e - b);
    DTORCH_CHECK(got.scalar_type() == dtype && torch::equal(got, want), key, " [", b, ", ", e,
                 ") differs: ", got, " vs ", want);
    checked += e - b;
  }
  for (const auto& [key, want] : toy_full(step))
    DTORCH_CHECK(torch::equal(reader.read_full(key), want), key, " differs");
  std::ofstream(str(args.at(0), "/load-", comm->size(), "-", comm->rank(), ".ok")) << checked;
}

TEST(ShardedCheckpoint, SavedAtFourReadsBackAtTwoAndOne) {
  std::string dir = toy_checkpoint_copy("sharded-reshard");
  EXPECT_EQ(list_sharded_checkpoints(dir),
            (std::vector<std::string>{sharded_step_dir(dir, 20), sharded_step_dir(dir, 10)}));
  for (int w = 0; w < 4; ++w)
    EXPECT_TRUE(paths::exists(str(dir, "/step-000020/shard-0000", w, "-of-00004.pt"))) << w;
  ASSERT_EQ(testing::run_ranks(2, "sharded_load", {dir, "20"}, 120), 0);
  ASSERT_EQ(testing::run_ranks(1, "sharded_load", {dir, "20"}, 120), 0);
  // Together the ranks of each world size read every element once (10+7+3 per unit key).
  const int64_t total = 3 * (10 + 7 + 3) + 7;
  int64_t two = 0, one = 0;
  for (int r = 0; r < 2; ++r)
    two += std::stoll(testing::read_file(str(dir, "/load-2-", r, ".ok")));
  one = std::stoll(testing::read_file(str(dir, "/load-1-0.ok")));
  EXPECT_EQ(two, total);
  EXPECT_EQ(one, total);
}

TEST(ShardedCheckpoint, MetadataRecordsWhatWasSaved) {
  ShardedCheckpointReader reader(toy_checkpoint_copy("sharded-meta") + "/step-000010");
  EXPECT_EQ(reader.version(), kShardedCheckpointVersion);
  EXPECT_EQ(reader.data().epoch, 1);
  EXPECT_EQ(reader.data().metadata_json, R"({"model":"toy","strategy":"zero2"})");
  ASSERT_EQ(reader.data().layouts.size(), 3u);
  EXPECT_EQ(reader.data().layouts.at("1").at(0).name, "fc.weight");
  EXPECT_EQ(reader.data().layouts.at("1").at(0).shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(reader.data().layouts.at("0").at(1).offset, 8);
  const auto& p2 = reader.flat_tensors().at("param/2");
  EXPECT_EQ(p2.numel, 3);
  EXPECT_EQ(p2.ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 3}, {3, 3}}));
  EXPECT_EQ(reader.flat_tensors().at("optim/1/momentum_buffer").dtype, torch::kBFloat16);
  EXPECT_EQ(reader.full_tensors().at("optim/step").shape, std::vector<int64_t>{});
  EXPECT_EQ(reader.check_files().size(), 5u);  // 4 shards and full.pt
  EXPECT_NO_THROW(reader.verify());
}

TEST(ShardedCheckpoint, ConsolidateCutsParametersByLayout) {
  ShardedCheckpointReader reader(toy_checkpoint_copy("sharded-consolidate"));
  StateDict state = consolidate_model(reader);
  std::map<std::string, torch::Tensor> got(state.begin(), state.end());
  ASSERT_EQ(got.size(), 8u);  // 6 parameters, 2 buffers
  torch::Tensor p0 = toy_flat(20, "param/0", 10, torch::kFloat);
  EXPECT_TRUE(torch::equal(got.at("conv.weight"), p0.narrow(0, 0, 8).view({2, 1, 2, 2})));
  EXPECT_TRUE(torch::equal(got.at("conv.bias"), p0.narrow(0, 8, 2)));
  torch::Tensor p2 = toy_flat(20, "param/2", 3, torch::kFloat);
  EXPECT_EQ(got.at("scale").dim(), 0);
  EXPECT_EQ(got.at("scale").item<float>(), p2[0].item<float>());
  EXPECT_TRUE(torch::equal(got.at("bn.running_mean"), torch::tensor({20.25f, 20.75f})));
  EXPECT_EQ(got.at("bn.num_batches_tracked").item<int64_t>(), 20);
}

// Note [Saving replicated state]: largest first, each to the rank with the fewest bytes.
TEST(WritersByBytes, LargestFirstToTheLeastLoadedRank) {
  EXPECT_EQ(writers_by_bytes({10, 7, 5, 3, 1}, 2), (std::vector<int>{0, 1, 1, 0, 1}));
  EXPECT_EQ(writers_by_bytes({4, 4, 4}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(writers_by_bytes({}, 3), std::vector<int>{});
  EXPECT_THROW(writers_by_bytes({1}, 0), ConfigError);
  EXPECT_THROW(writers_by_bytes({-1}, 2), ConfigError);
}

// Against the best split found by trying every one: within 4/3 of it (Graham's bound for
// largest-first), and no rank above the mean plus one tensor.
TEST(WritersByBytes, WithinGrahamsBoundOfTheBestSplit) {
  torch::manual_seed(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int world = 2 + trial % 2, n = 3 + trial % 6;
    std::vector<int64_t> bytes;
    for (int i = 0; i < n; ++i)
      bytes.push_back(torch::randint(1, 1000, {1}).item<int64_t>());
    const std::vector<int> writer = writers_by_bytes(bytes, world);
    std::vector<int64_t> load(world, 0);
    for (int i = 0; i < n; ++i)
      load[writer[i]] += bytes[i];
    const int64_t got = *std::max_element(load.begin(), load.end());
    int64_t best = INT64_MAX;
    for (int64_t code = 0; code < static_cast<int64_t>(std::pow(world, n)); ++code) {
      std::vector<int64_t> l(world, 0);
      for (int64_t i = 0, c = code; i < n; ++i, c /= world)
        l[c % world] += bytes[i];
      best = std::min(best, *std::max_element(l.begin(), l.end()));
    }
    const int64_t total = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
    EXPECT_LE(3 * got, 4 * best) << "trial " << trial;
    EXPECT_LE(got, total / world + *std::max_element(bytes.begin(), bytes.end()));
  }
}

TEST(ShardedCheckpoint, CutByLayoutChecksBounds) {
  torch::Tensor flat = torch::arange(6, torch::kFloat);
  StateDict s = cut_by_layout(flat, {{"a", {2, 2}, 0}, {"b", {2}, 4}});
  EXPECT_TRUE(torch::equal(s[1].second, torch::tensor({4.f, 5.f})));
  EXPECT_THROW(cut_by_layout(flat, {{"c", {3}, 4}}), CheckpointError);
}

// Expects `fn` to throw CheckpointError whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " not in " << e.what();
  }
}

// latest_complete(dir) on a run whose step 20 is damaged: step 10, with a warning naming `bad`.
void expect_fallback(const std::string& dir, const std::string& bad, const std::string& why) {
  ::testing::internal::CaptureStderr();
  auto latest = latest_complete(dir);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, sharded_step_dir(dir, 10));
  EXPECT_NE(err.find(bad), std::string::npos) << err;
  EXPECT_NE(err.find(why), std::string::npos) << err;
  EXPECT_NE(err.find("falling back"), std::string::npos) << err;
}

void flip_shard_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x40;
  f.seekp(at);
  f.write(&c, 1);
}

TEST(ShardedCheckpoint, MissingShardIsNamedAndOnlyOverlappingFilesAreRead) {
  std::string dir = toy_checkpoint_copy("sharded-missing");
  const std::string shard = dir + "/step-000020/shard-00003-of-00004.pt";
  paths::remove(shard);
  ShardedCheckpointReader reader(dir + "/step-000020");
  // param/0's [0, 9) lies on ranks 0-2: rank 3's file is not needed.
  EXPECT_TRUE(torch::equal(reader.read_range("param/0", 0, 9),
                           toy_flat(20, "param/0", 10, torch::kFloat).narrow(0, 0, 9)));
  expect_error([&] { reader.read_range("param/0", 8, 10); }, {shard, "missing", "older step"});
  expect_error([&] { reader.verify(); }, {shard, "missing"});
  expect_fallback(dir, shard, "missing");
  // Opening the run directory falls back the same way.
  ::testing::internal::CaptureStderr();
  ShardedCheckpointReader run(dir);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(run.data().global_step, 10);
}

TEST(ShardedCheckpoint, TruncatedShardIsCaught) {
  std::string dir = toy_checkpoint_copy("sharded-truncated");
  const std::string shard = dir + "/step-000020/shard-00001-of-00004.pt";
  paths::resize_file(shard, paths::file_size(shard) / 2);
  ShardedCheckpointReader reader(dir + "/step-000020");
  expect_error([&] { reader.read_flat("param/1"); }, {shard, "truncated"});
  expect_fallback(dir, shard, "truncated");
}

TEST(ShardedCheckpoint, CorruptShardIsCaughtByCrc) {
  std::string dir = toy_checkpoint_copy("sharded-corrupt");
  const std::string shard = dir + "/step-000020/full.pt";
  flip_shard_byte(shard, paths::file_size(shard) / 2);
  ShardedCheckpointReader reader(dir + "/step-000020");
  expect_error([&] { reader.read_full("optim/step"); }, {shard, "CRC32 mismatch"});
  auto files = reader.check_files();
  int bad = 0;
  for (const auto& f : files)
    bad += !f.ok;
  EXPECT_EQ(bad, 1);
  expect_fallback(dir, shard, "CRC32 mismatch");
}

// The newest complete checkpoint, opened: the reader that found its files whole, which reads
// what a fresh one does; a damaged newer one is skipped for it as for latest_complete.
TEST(ShardedCheckpoint, TheNewestCompleteOpensAsItIsFound) {
  std::string dir = toy_checkpoint_copy("sharded-open-latest");
  std::optional<ShardedCheckpointReader> r = open_latest_complete(dir);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->dir(), *latest_complete(dir));
  ShardedCheckpointReader fresh(r->dir());
  EXPECT_TRUE(torch::equal(r->read_flat("param/1"), fresh.read_flat("param/1")));
  EXPECT_TRUE(torch::equal(r->read_full("optim/step"), fresh.read_full("optim/step")));
  flip_shard_byte(dir + "/step-000020/full.pt", 100);
  ::testing::internal::CaptureStderr();
  r = open_latest_complete(dir);
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->data().global_step, 10);
  EXPECT_FALSE(open_latest_complete(testing::scratch_dir("sharded-open-none")).has_value());
}

TEST(ShardedCheckpoint, MissingMetadataMeansIncomplete) {
  std::string dir = toy_checkpoint_copy("sharded-no-meta");
  paths::remove(dir + "/step-000020/metadata.json");
  expect_error([&] { ShardedCheckpointReader r(dir + "/step-000020"); },
               {dir + "/step-000020/metadata.json", "incomplete", "older step"});
  EXPECT_EQ(list_sharded_checkpoints(dir), std::vector<std::string>{sharded_step_dir(dir, 10)});
  EXPECT_EQ(ShardedCheckpointReader(dir).data().global_step, 10);
}

TEST(ShardedCheckpoint, GarbledMetadataIsNamed) {
  std::string dir = toy_checkpoint_copy("sharded-garbled");
  const std::string meta = dir + "/step-000020/metadata.json";
  std::ofstream(meta, std::ios::trunc) << "{\"format\": \"dtorch-sharded-checkpoint\", \"vers";
  expect_error([&] { ShardedCheckpointReader r(dir + "/step-000020"); },
               {meta, "not valid JSON", "older step"});
  expect_fallback(dir, meta, "not valid JSON");
  std::ofstream(meta, std::ios::trunc)
      << R"({"format": "dtorch-sharded-checkpoint", "version": 1})";
  expect_error([&] { ShardedCheckpointReader r(dir + "/step-000020"); }, {meta, "malformed"});
}

TEST(ShardedCheckpoint, AllDamagedIsAnErrorNamingEach) {
  std::string dir = toy_checkpoint_copy("sharded-all-bad");
  paths::remove(dir + "/step-000020/shard-00000-of-00004.pt");
  paths::resize_file(dir + "/step-000010/full.pt", 3);
  ::testing::internal::CaptureStderr();
  expect_error([&] { latest_complete(dir); },
               {"step-000020", "shard-00000-of-00004.pt", "step-000010", "full.pt", "truncated",
                "start from scratch"});
  ::testing::internal::GetCapturedStderr();
}

TEST(ShardedCheckpoint, NotACheckpointSaysWhatToPass) {
  std::string dir = testing::scratch_dir("sharded-not");
  std::ofstream(dir + "/notes.txt") << "hello";
  expect_error([&] { ShardedCheckpointReader r(dir); },
               {dir, "not a sharded checkpoint", "step-NNNNNN"});
  expect_error([&] { ShardedCheckpointReader r(dir + "/absent"); }, {"does not exist"});
  EXPECT_FALSE(latest_complete(dir).has_value());
  paths::create_directory(dir + "/step-000005");  // an unfinished save only
  expect_error([&] { ShardedCheckpointReader r(dir); }, {"only unfinished saves"});
}

// ---- saving at world size 1, in this process ----------------------------------------------

std::shared_ptr<comm::Communicator> solo() {
  return comm::Communicator::create(launch::RankInfo{});
}

ShardedCheckpointData toy_data(int64_t step) {
  ShardedCheckpointData d;
  d.epoch = step;
  d.global_step = step;
  d.layouts = testing::toy_layouts();
  return d;
}

std::vector<ShardPiece> whole_pieces(int64_t step) {
  std::vector<ShardPiece> v;
  for (const auto& [key, numel, dtype] : toy_flat_keys())
    v.push_back({key, numel, 0, toy_flat(step, key, numel, dtype)});
  return v;
}

TEST(ShardedCheckpoint, KeepsTheNewestK) {
  std::string dir = testing::scratch_dir("sharded-keep");
  auto comm = solo();
  for (int64_t s = 1; s <= 4; ++s)
    save_sharded_checkpoint(dir, toy_data(s), whole_pieces(s), toy_full(s), *comm);
  EXPECT_EQ(list_sharded_checkpoints(dir),
            (std::vector<std::string>{sharded_step_dir(dir, 4), sharded_step_dir(dir, 3)}));
  save_sharded_checkpoint(dir, toy_data(5), whole_pieces(5), toy_full(5), *comm, /*keep=*/1);
  EXPECT_EQ(list_sharded_checkpoints(dir), std::vector<std::string>{sharded_step_dir(dir, 5)});
  EXPECT_FALSE(paths::exists(sharded_step_dir(dir, 4)));
  EXPECT_THROW(save_sharded_checkpoint(dir, toy_data(6), whole_pieces(6), {}, *comm, 0),
               ConfigError);
  // Re-saving a step replaces it whole.
  auto pieces = whole_pieces(7);
  save_sharded_checkpoint(dir, toy_data(5), pieces, toy_full(5), *comm, 2);
  ShardedCheckpointReader r(dir);
  EXPECT_TRUE(torch::equal(r.read_flat("param/1"), toy_flat(7, "param/1", 7, torch::kFloat)));
  EXPECT_NO_THROW(r.verify());
  for (const std::string& name : paths::list_directory(dir))
    EXPECT_EQ(name.find('.'), std::string::npos) << name;
}

TEST(ShardedCheckpoint, ViewsSaveOnlyTheirElements) {
  // A sharding engine's pieces are views into big flat buffers; pickling a view as is would
  // store the whole buffer (4 MB here) in every shard.
  std::string dir = testing::scratch_dir("sharded-views");
  torch::Tensor big = torch::arange(1000000, torch::kFloat);
  ShardedCheckpointData d;
  d.global_step = 3;
  save_sharded_checkpoint(dir, d, {{"param/x", 10, 0, big.narrow(0, 500, 10)}}, {}, *solo());
  EXPECT_LT(paths::file_size(sharded_step_dir(dir, 3) + "/shard-00000-of-00001.pt"), 20000u);
  ShardedCheckpointReader r(dir);
  EXPECT_TRUE(torch::equal(r.read_flat("param/x"), big.narrow(0, 500, 10)));
  EXPECT_TRUE(torch::equal(r.read_range("param/x", 3, 3), torch::empty({0})));
  expect_error([&] { r.read_range("param/x", 5, 11); }, {"outside its 10 elements"});
  expect_error([&] { r.read_range("param/y", 0, 1); }, {"no flat tensor \"param/y\""});
}

// A shard is mapped, not read into memory: a range costs memory for itself, not for its file
// (a resumed gpt-xl shard is 9 GB), and a write to what the reader returns never reaches it.
TEST(ShardedCheckpoint, ARangeCostsItselfNotItsFile) {
  std::string dir = testing::scratch_dir("sharded-mapped");
  const int64_t n = int64_t{16} << 20;  // 64 MiB of floats
  ShardedCheckpointData d;
  d.global_step = 1;
  save_sharded_checkpoint(dir, d, {{"param/x", n, 0, torch::arange(n, torch::kFloat)}},
                          {{"optim/step", torch::tensor({int64_t{7}})}}, *solo());
  ShardedCheckpointReader r(dir);
  EXPECT_TRUE(torch::equal(r.read_range("param/x", 0, 4), torch::arange(4)));  // code paged in
  const int64_t before = testing::resident_bytes(testing::Resident::All);
  EXPECT_TRUE(torch::equal(r.read_range("param/x", n - 4, n), torch::arange(n - 4, n)));
  EXPECT_LT(testing::resident_bytes(testing::Resident::All) - before, int64_t{16} << 20)
      << "the reader holds its file";
  r.read_full("optim/step").fill_(0);
  ShardedCheckpointReader again(dir);
  EXPECT_EQ(again.read_full("optim/step").item<int64_t>(), 7);
  EXPECT_NO_THROW(again.verify());
}

TEST(ShardedCheckpoint, BadInputWritesNothingAndKeepsTheOld) {
  std::string dir = testing::scratch_dir("sharded-bad-input");
  auto comm = solo();
  save_sharded_checkpoint(dir, toy_data(1), whole_pieces(1), toy_full(1), *comm);
  auto gap = whole_pieces(2);
  gap[0].data = gap[0].data.narrow(0, 0, 4);  // param/0 ends at 4 of 10
  expect_error([&] { save_sharded_checkpoint(dir, toy_data(2), gap, {}, *comm); },
               {"param/0", "elements [4, 10) are saved by no rank"});
  auto not_json = toy_data(2);
  not_json.metadata_json = "[1, 2";
  expect_error([&] { save_sharded_checkpoint(dir, not_json, whole_pieces(2), {}, *comm); },
               {"metadata must be a JSON object"});
  auto past_end = toy_data(2);
  past_end.layouts["1"].push_back({"extra", {4}, 5});
  expect_error([&] { save_sharded_checkpoint(dir, past_end, whole_pieces(2), {}, *comm); },
               {"\"extra\"", "runs past"});
  auto twice = whole_pieces(2);
  twice.push_back(twice[0]);
  expect_error([&] { save_sharded_checkpoint(dir, toy_data(2), twice, {}, *comm); },
               {"given twice"});
  auto clash = toy_full(2);
  clash.emplace_back("param/0", torch::zeros({10}));
  expect_error([&] { save_sharded_checkpoint(dir, toy_data(2), whole_pieces(2), clash, *comm); },
               {"both a flat and a full tensor"});
  // Nothing new on disk, and the old checkpoint is intact.
  EXPECT_EQ(list_sharded_checkpoints(dir), std::vector<std::string>{sharded_step_dir(dir, 1)});
  EXPECT_FALSE(paths::exists(sharded_step_dir(dir, 2)));
  EXPECT_FALSE(paths::exists(sharded_step_dir(dir, 2) + ".partial"));
  EXPECT_EQ(latest_complete(dir), sharded_step_dir(dir, 1));
}

// args: DIR. Rank 1 leaves a gap in param/0; every rank must fail with the same message rather
// than some hanging in a collective.
DTORCH_TEST_WORKER(sharded_bad_tiling) {
  auto comm = comm::Communicator::from_env();
  std::vector<ShardPiece> mine;
  for (const auto& [key, numel, dtype] : toy_flat_keys()) {
    auto [b, e] = even_split(numel, comm->size(), comm->rank());
    if (comm->rank() == 1 && key == "param/0") e -= 2;
    mine.push_back({key, numel, b, toy_flat(1, key, numel, dtype).narrow(0, b, e - b)});
  }
  try {
    save_sharded_checkpoint(args.at(0) + "/run", toy_data(1), mine, toy_full(1), *comm);
  } catch (const CheckpointError& e) {
    std::ofstream(str(args.at(0), "/rank", comm->rank())) << e.what();
  }
  comm->barrier();
}

TEST(ShardedCheckpoint, PiecesThatDoNotTileFailOnEveryRank) {
  std::string dir = testing::scratch_dir("sharded-bad-tiling");
  ASSERT_EQ(testing::run_ranks(2, "sharded_bad_tiling", {dir}, 60), 0);
  for (int r = 0; r < 2; ++r) {
    std::string msg = testing::read_file(str(dir, "/rank", r));
    EXPECT_NE(msg.find("\"param/0\": elements [8, 10) are saved by no rank"), std::string::npos)
        << r << ": " << msg;
  }
  EXPECT_TRUE(list_sharded_checkpoints(dir + "/run").empty());
}

}  // namespace
}  // namespace dtorch::checkpoint
