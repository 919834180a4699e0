// What a model reports of its own work for the planner: a transformer's shape, what its blocks
// keep for backward and its units' sizes, so plan/ and tools/ read no concrete model.
#pragma once

#include <cstdint>
#include <vector>

namespace dtorch::models {

/// A transformer's work as the planner counts it (plan/cost_model.h, Note [Cost model]) and
/// `dtorch bench memory` counts its attention's bytes: its shape, what a block keeps for
/// backward, its units' sizes. Each model reports its own (Model::workload), so no planner
/// or tool reads a model's config. A model that is not a transformer reports none (no heads):
/// the planner measures its units instead.
struct Workload {
  /// Its blocks, their width (C), attention heads and MLP width (M).
  int64_t layers = 0, hidden = 0, heads = 0, mlp = 0;
  /// The most tokens a sample has: a language model's block size, a ViT's patches and class
  /// token.
  int64_t tokens = 0;
  /// A language model's vocabulary: its tied embedding, and the head's outputs for every token
  /// (split by tensor parallelism). 0 for a classifier.
  int64_t vocab = 0;
  /// A classifier's classes: its head's outputs, for its class token alone (whole on every
  /// rank). 0 for a language model.
  int64_t classes = 0;
  /// Its patch embedding's forward floating-point operations per sample (a ViT's convolution,
  /// at the machine's convolution rate); 0 without one.
  double patch_flops = 0;
  /// The floats a block keeps for backward per token, in units of C: split by tensor
  /// parallelism and whole (Note [Cost model]); its attention matrices come on top.
  double split_activations = 0, whole_activations = 0;
  /// Parameters of each pipeline unit (Note [Pipeline units]), as models::model_units counts
  /// them, from the shape alone (no unit is built).
  std::vector<int64_t> unit_parameters;
  /// Whether it is a transformer (one with attention heads).
  bool transformer() const { return heads > 0; }
  /// Whether it is a language model: its embedding is tied to its head.
  bool language() const { return vocab > 0; }
};

}  // namespace dtorch::models
