// Tests for distributed sampling: equal counts, coverage, disjointness, per-epoch reshuffle,
// exact evaluation sharding, batching, and identity with PyTorch's own DistributedSampler.
#include "dtorch/data/sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtorch/core/error.h"
#include "models/python_peer.h"
#include "support/workers.h"

namespace dtorch::data {
namespace {

std::vector<std::vector<int64_t>> all_ranks(int64_t n, int world, uint64_t seed, int64_t epoch,
                                            bool shuffle = true) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, seed, shuffle);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DataSampler, EqualCountsAndFullCoverage) {
  for (int64_t n : {1, 2, 7, 10, 100, 101}) {
    for (int world : {1, 2, 3, 4}) {
      auto ranks = all_ranks(n, world, 3, 1);
      const int64_t per_rank = (n + world - 1) / world;
      std::map<int64_t, int> seen;
      for (const auto& idx : ranks) {
        ASSERT_EQ(static_cast<int64_t>(idx.size()), per_rank) << n << " " << world;
        for (int64_t i : idx) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          ++seen[i];
        }
      }
      // Every sample is visited; padding wraps around, so with total = per_rank * world
      // visits each sample comes floor(total / n) or ceil(total / n) times.
      const int64_t total = per_rank * world;
      ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << n << " " << world;
      int64_t visits = 0;
      for (const auto& [i, count] : seen) {
        ASSERT_GE(count, total / n);
        ASSERT_LE(count, (total + n - 1) / n);
        visits += count;
      }
      EXPECT_EQ(visits, total) << n << " " << world;
    }
  }
}

TEST(DataSampler, DisjointWhenDivisible) {
  auto ranks = all_ranks(120, 4, 0, 0);
  std::set<int64_t> all;
  for (const auto& idx : ranks)
    all.insert(idx.begin(), idx.end());
  EXPECT_EQ(all.size(), 120u);
}

TEST(DataSampler, SameOrderForSameSeedAndEpochReshuffledPerEpoch) {
  DistributedSampler a(1000, 1, 2, 42), b(1000, 1, 2, 42);
  a.set_epoch(3);
  b.set_epoch(3);
  // Drawing from the global generator in between must not change the order.
  torch::rand({100});
  EXPECT_EQ(a.indices(), b.indices());
  auto e3 = a.indices();
  a.set_epoch(4);
  EXPECT_NE(a.indices(), e3);
  a.set_epoch(3);
  EXPECT_EQ(a.indices(), e3);
  DistributedSampler other_seed(1000, 1, 2, 43);
  other_seed.set_epoch(3);
  EXPECT_NE(other_seed.indices(), e3);
}

TEST(DataSampler, NoShuffleKeepsDatasetOrderStrided) {
  auto ranks = all_ranks(7, 3, 0, 5, /*shuffle=*/false);
  EXPECT_EQ(ranks[0], (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(ranks[1], (std::vector<int64_t>{1, 4, 0}));
  EXPECT_EQ(ranks[2], (std::vector<int64_t>{2, 5, 1}));
}

TEST(DataSampler, PermutationIsAPermutation) {
  auto p = epoch_permutation(500, 9, 2);
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < 500; ++i)
    ASSERT_EQ(p[i], i);
  EXPECT_TRUE(epoch_permutation(0, 1, 1).empty());
  EXPECT_TRUE(DistributedSampler(0, 0, 2).indices().empty());
}

TEST(DataSampler, BadRankOrWorldIsConfigError) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), ConfigError);
  EXPECT_THROW(DistributedSampler(10, 0, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(10, -1, 2), ConfigError);
  EXPECT_THROW(eval_shard(10, 3, 3), ConfigError);
}

TEST(DataSampler, EvalShardsCoverEachSampleOnce) {
  for (int64_t n : {0, 1, 2, 5, 7, 10, 10001}) {
    for (int world : {1, 2, 3}) {
      std::vector<int> count(n, 0);
      int64_t expect_begin = 0, smallest = n, largest = 0;
      for (int r = 0; r < world; ++r) {
        IndexRange s = eval_shard(n, r, world);
        EXPECT_EQ(s.begin, expect_begin) << "shards are contiguous and in rank order";
        expect_begin = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
        for (int64_t i = s.begin; i < s.end; ++i)
          ++count[i];
      }
      EXPECT_EQ(expect_begin, n);
      EXPECT_LE(largest - smallest, 1);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(count[i], 1) << n << " " << world << " " << i;
    }
  }
}

TEST(DataSampler, Batches) {
  std::vector<int64_t> idx = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  auto kept = make_batches(idx, 4);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0], (std::vector<int64_t>{9, 8, 7, 6}));
  EXPECT_EQ(kept[2], (std::vector<int64_t>{1, 0}));
  auto dropped = make_batches(idx, 4, /*drop_last=*/true);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[1], (std::vector<int64_t>{5, 4, 3, 2}));
  EXPECT_EQ(make_batches(idx, 5, true).size(), 2u);
  EXPECT_EQ(num_batches(10, 4), 3);
  EXPECT_EQ(num_batches(10, 4, true), 2);
  EXPECT_EQ(num_batches(0, 4), 0);
  EXPECT_TRUE(make_batches({}, 3).empty());
  EXPECT_THROW(make_batches(idx, 0), ConfigError);
}

TEST(DataSampler, SameIndicesAsPyTorchDistributedSampler) {
  DTORCH_SKIP_WITHOUT_PYTHON(/*need_peer=*/false);
  auto dir = dtorch::testing::scratch_dir("sampler-python");
  std::string out;
  int rc = dtorch::testing::run_python(dir, "sampler", R"PY(
from torch.utils.data import DistributedSampler
n, world, seed, epoch = (int(a) for a in sys.argv[2:6])
ranks = []
for r in range(world):
    s = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=seed)
    s.set_epoch(epoch)
    ranks.append(list(s))
print(json.dumps(ranks))
)PY",
                                       {"103", "3", "7", "2"}, &out);
  ASSERT_EQ(rc, 0) << out;
  auto python = nlohmann::json::parse(out.substr(out.find('[')));
  auto cpp = all_ranks(103, 3, 7, 2);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(python[r].get<std::vector<int64_t>>(), cpp[r]) << r;
}

}  // namespace
}  // namespace dtorch::data
