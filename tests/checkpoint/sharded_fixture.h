// A small sharded checkpoint with known contents, saved once by 4 real ranks and shared by the
// sharded-checkpoint and `dtorch checkpoint` tests: three units whose sizes 4 does not divide.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtorch/checkpoint/sharded_checkpoint.h"

namespace dtorch::testing {

/// The units' layouts: "0" conv.weight [2,1,2,2] + conv.bias [2] (10 elements), "1" fc.weight
/// [3,2] + fc.bias [1] (7), "2" scale [] + gain [2] (3: one rank of 4 owns nothing).
std::map<std::string, std::vector<checkpoint::FlatLayoutEntry>> toy_layouts();
/// Every flat key with its numel and dtype (params float32, exp_avg_sq float64, one bf16).
std::vector<std::tuple<std::string, int64_t, torch::Dtype>> toy_flat_keys();
/// The value of flat tensor `key` at `step`: step*1000 + code(key) + 0.5*i, in its dtype,
/// where code(key) is the sum of its bytes mod 97.
torch::Tensor toy_flat(int64_t step, const std::string& key, int64_t numel, torch::Dtype dtype);
/// Full tensors at `step`: buffer/bn.running_mean [step+0.25, step+0.75],
/// buffer/bn.num_batches_tracked = step, optim/step = step (int64 scalars).
std::vector<std::pair<std::string, torch::Tensor>> toy_full(int64_t step);
/// [begin, end) of rank `rank` of `world` in an even split rounded up (ZeRO's split).
std::pair<int64_t, int64_t> even_split(int64_t numel, int world, int rank);

/// A fresh copy, in scratch folder `name`, of a run directory where 4 ranks saved the toy
/// checkpoint at steps 10 (epoch 1) and 20 (epoch 2), metadata {"model":"toy",
/// "strategy":"zero2"}. The 4-rank save runs once per test process.
std::string toy_checkpoint_copy(const std::string& name);

}  // namespace dtorch::testing
