// Several pipeline stages of one model held by one rank (an interleaved schedule's virtual
// stages) seen as one module, so that a data-parallel strategy, a checkpoint or a state dict
// takes them as it takes a single stage: same parameter names as the whole model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::models {

/// Note [Stage union]: the stages' module trees are merged by path: a submodule only one stage
/// has is shared as it is, a path several stages have ("transformer", "transformer.h") becomes
/// a fresh container holding what each of them holds below it. Parameters and buffers are the
/// stages' own tensors, under the whole model's names, so gradients the stages compute are the
/// union's gradients and whatever is loaded into the union is in the stages. Two stages may not
/// hold a parameter of the same name (a GPT's tied embedding sits on the first and last stage,
/// which an interleaved schedule puts on different ranks). forward() refuses: the stages run
/// one at a time through pp::Pipeline. block_names() lists every stage's blocks, and
/// tp::plan_for gives the union every stage's rules, so tensor parallelism splits a union as
/// it splits its stages.
class StageUnion : public Model {
 public:
  /// `stages`: this rank's stages of one model, in stage order. ConfigError when empty or
  /// when two of them hold the same parameter or buffer.
  explicit StageUnion(std::vector<std::shared_ptr<Model>> stages);

  torch::Tensor forward(torch::Tensor x) override;
  /// Sets the mode of the stages too (their roots are not children of the union).
  void train(bool on = true) override;
  bool takes_tokens() const override { return stages_.front()->takes_tokens(); }
  int64_t max_sequence_length() const override { return stages_.front()->max_sequence_length(); }
  std::vector<std::string> unit_names() const override { return stages_.front()->unit_names(); }
  /// The stages are parts of one model: they share its Python aliases.
  std::vector<PythonAlias> python_aliases() const override {
    return stages_.front()->python_aliases();
  }
  /// Every stage's blocks, in stage order (sequence parallelism finds them by name).
  std::vector<std::string> block_names() const override;
  const std::vector<std::shared_ptr<Model>>& stages() const { return stages_; }

 private:
  std::vector<std::shared_ptr<Model>> stages_;
};

}  // namespace dtorch::models
