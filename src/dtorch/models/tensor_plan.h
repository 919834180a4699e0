// A tensor-parallel plan as plain data: which modules of a model are split and how (PyTorch's
// parallelize_module plan, Megatron-LM's layer choices). A model that can be split gives its
// own plan (Model::tensor_parallel_plan, written beside its architecture, as torchtitan keeps
// each model's plan with the model); parallel/tp applies a plan to any model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtorch::models {

enum class TensorSplit {
  /// Linear (or a module's own weight and bias): output features split across ranks; the
  /// input enters the region (copy_to_region, or gather_from_sequence with sequence
  /// parallelism).
  Colwise,
  /// Linear: input features split; the partial outputs are summed (reduce_from_region, or
  /// reduce_scatter_to_sequence), then the bias, kept whole, is added once.
  Rowwise,
  /// Embedding: rows (the vocabulary) split; ids outside this rank's rows give zeros, and
  /// the partial embeddings are summed.
  VocabEmbedding,
  /// The module's output is the input of a vocabulary-parallel output layer (a tied head):
  /// copy_to_region, or gather_from_sequence with sequence parallelism.
  EnterVocabRegion,
  /// With sequence parallelism, the module's input is cut to this rank's slice of the
  /// sequence (the first block); no effect otherwise.
  SequenceScatter,
  /// With sequence parallelism, the module's output is gathered to the whole sequence (the
  /// last block); no effect otherwise.
  SequenceGather,
};

struct TensorRule {
  /// Module path as named_modules() spells it; "*" stands for one path component
  /// ("transformer.h.*.attn.c_attn").
  std::string module;
  TensorSplit style;
  /// Colwise only: the output is this many equal parts concatenated (a fused q|k|v
  /// projection: 3), each split across ranks, so every rank gets its heads of each.
  int64_t fused = 1;
};

using TensorPlan = std::vector<TensorRule>;

/// Whether module path `path` matches `pattern`, in which "*" stands for exactly one
/// dot-separated component ("transformer.h.*.attn" matches transformer.h.0.attn, not
/// transformer.h.attn): tensor-parallel rules and unit policies (wrapped_module.h) alike.
bool module_path_matches(const std::string& pattern, const std::string& path);

/// ConfigError unless `tp` ranks divide `n` (the `what` of `model`: "attention heads" of "this
/// GPT"), naming both and the fix.
void check_tensor_split(int tp, int64_t n, const std::string& what, const std::string& model);

}  // namespace dtorch::models
