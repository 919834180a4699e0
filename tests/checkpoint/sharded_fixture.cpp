// The toy sharded checkpoint of sharded_fixture.h: its contents as pure functions, and the
// 4-rank worker that saves it.
#include "checkpoint/sharded_fixture.h"

#include <gtest/gtest.h>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/paths.h"
#include "support/workers.h"

namespace dtorch::testing {

std::map<std::string, std::vector<checkpoint::FlatLayoutEntry>> toy_layouts() {
  return {{"0", {{"conv.weight", {2, 1, 2, 2}, 0}, {"conv.bias", {2}, 8}}},
          {"1", {{"fc.weight", {3, 2}, 0}, {"fc.bias", {1}, 6}}},
          {"2", {{"scale", {}, 0}, {"gain", {2}, 1}}}};
}

std::vector<std::tuple<std::string, int64_t, torch::Dtype>> toy_flat_keys() {
  std::vector<std::tuple<std::string, int64_t, torch::Dtype>> keys;
  const std::pair<const char*, int64_t> units[] = {{"0", 10}, {"1", 7}, {"2", 3}};
  for (const auto& [u, n] : units) {
    const std::string unit = u;
    keys.emplace_back("param/" + unit, n, torch::kFloat);
    keys.emplace_back("optim/" + unit + "/exp_avg", n, torch::kFloat);
    keys.emplace_back("optim/" + unit + "/exp_avg_sq", n, torch::kDouble);
  }
  keys.emplace_back("optim/1/momentum_buffer", 7, torch::kBFloat16);
  return keys;
}

torch::Tensor toy_flat(int64_t step, const std::string& key, int64_t numel, torch::Dtype dtype) {
  int code = 0;
  for (unsigned char c : key)
    code += c;
  code %= 97;
  return (torch::arange(numel, torch::kDouble) * 0.5 + double(step * 1000 + code)).to(dtype);
}

std::vector<std::pair<std::string, torch::Tensor>> toy_full(int64_t step) {
  return {{"buffer/bn.running_mean", torch::tensor({step + 0.25f, step + 0.75f})},
          {"buffer/bn.num_batches_tracked", torch::tensor(step, torch::kLong)},
          {"optim/step", torch::tensor(step, torch::kLong)}};
}

std::pair<int64_t, int64_t> even_split(int64_t numel, int world, int rank) {
  const int64_t chunk = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, rank * chunk);
  return {begin, std::min(numel, begin + chunk)};
}

// args: DIR. Saves steps 10 and 20; each rank's pieces are views into one padded flat buffer
// per key, as a sharding engine holds them.
DTORCH_TEST_WORKER(sharded_save) {
  auto comm = comm::Communicator::from_env();
  for (int64_t step : {10, 20}) {
    std::vector<checkpoint::ShardPiece> mine;
    std::vector<torch::Tensor> buffers;
    for (const auto& [key, numel, dtype] : toy_flat_keys()) {
      auto [b, e] = even_split(numel, comm->size(), comm->rank());
      const int64_t chunk = (numel + comm->size() - 1) / comm->size();
      torch::Tensor padded = torch::zeros({chunk * comm->size()}, dtype);
      padded.narrow(0, 0, numel).copy_(toy_flat(step, key, numel, dtype));
      mine.push_back({key, numel, b, padded.narrow(0, b, e - b)});
    }
    checkpoint::ShardedCheckpointData data;
    data.epoch = step / 10;
    data.global_step = step;
    data.metadata_json = R"({"model":"toy","strategy":"zero2"})";
    data.layouts = toy_layouts();
    checkpoint::save_sharded_checkpoint(args.at(0), data, mine, toy_full(step), *comm);
  }
}

std::string toy_checkpoint_copy(const std::string& name) {
  static std::string saved;
  if (saved.empty()) {
    std::string dir = scratch_dir("sharded-toy");
    EXPECT_EQ(run_ranks(4, "sharded_save", {dir}, 120), 0);
    saved = dir;
  }
  std::string copy = scratch_dir(name);
  paths::copy_tree(saved, copy);
  return copy;
}

}  // namespace dtorch::testing
