// A tensor-parallel plan: which modules of a model are split and how (PyTorch's
// parallelize_module plan, Megatron-LM's layer choices), as plain data. The plans for the
// built-in transformers live here; tensor_parallel.h applies a plan to a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::tp {

enum class Style {
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

std::string to_string(Style s);

struct Rule {
  /// Module path as named_modules() spells it; "*" stands for one path component
  /// ("transformer.h.*.attn.c_attn").
  std::string module;
  Style style;
  /// Colwise only: the output is this many equal parts concatenated (a fused q|k|v
  /// projection: 3), each split across ranks, so every rank gets its heads of each.
  int64_t fused = 1;
};

using Plan = std::vector<Rule>;

/// Whether `path` matches `pattern` ("*" matches exactly one dot-separated component).
bool matches(const std::string& pattern, const std::string& path);

/// Megatron's plan for the built-in transformers, checked against `tp_size` ranks (heads,
/// MLP width and vocabulary must divide): gpt-* (attention by heads, MLP by hidden units,
/// vocabulary-parallel embedding and tied head), vit-* (attention by heads, MLP; patch
/// embedding, class head and norms replicated). Other models get a ConfigError.
Plan plan_for(const models::Model& model, int tp_size);

}  // namespace dtorch::tp
