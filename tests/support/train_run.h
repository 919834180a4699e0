// What a `dtorch train` run left in its --out directory, for tests that compare runs.
#pragma once

#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dtorch::testing {

/// `dtorch train` of gpt-debug on Debian's fortunes: 2 epochs (or `epochs`) of 256 windows of
/// 32 bytes, batch 8 per rank, AdamW 0.002, `nproc` local ranks, into `out`.
std::vector<std::string> gpt_debug_train_args(const std::string& out, const std::string& strategy,
                                              int nproc, int epochs = 2);

/// `a` with `more` appended: a run's arguments and a few more flags.
inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

/// The records of OUT/metrics.jsonl of one kind ("epoch", "step"), parsed, in order.
std::vector<nlohmann::json> records_of(const std::string& out, const std::string& kind);
/// The epoch records of OUT/metrics.jsonl.
std::vector<nlohmann::json> epochs_of(const std::string& out);

/// A state dict file (model.pt, or what `checkpoint consolidate` wrote) by name.
std::map<std::string, torch::Tensor> model_file(const std::string& path);

/// Expects the run in `got` to have `want`'s losses and accuracy every epoch (within 1e-4) and
/// its final weights (1e-4; 5e-4 for attention's query and key weights, whose small gradients
/// Adam scales up; the key bias, whose gradient is rounding noise, is left out; gpt's and vit's
/// names).
void expect_same_run(const std::string& got, const std::string& want, const std::string& name);

/// Expects `folder`'s newest checkpoint to be shards, no .dtc beside them, of which each of the
/// `ranks` ranks that saved them wrote some tensors (Note [Saving replicated state]).
void expect_every_rank_wrote_shards(const std::string& folder, int ranks);

}  // namespace dtorch::testing
