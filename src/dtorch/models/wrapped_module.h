// Your own LibTorch module as a models::Model, so that what dtorch applies to its own models
// (ZeRO-3's units, activation checkpointing) applies to it, with its parameters' names unchanged:
//   dtorch::models::UnitPolicy units;
//   units.modules = {"blocks.*"};  // in Net::forward each runs as x = models::call(blocks[i], x)
//   auto model = dtorch::models::wrap_module(net, units);
//   auto sharded = dtorch::zero::shard(model, comm, zero_options /* stage 3 */, make_adamw);
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dtorch/models/model.h"
#include "dtorch/models/tensor_plan.h"

namespace dtorch::models {

/// Which of a module's submodules are its units: what ZeRO-3 gathers one at a time and
/// activation checkpointing recomputes (FSDP's auto-wrap policy). Units come in the order
/// named_modules() lists them, which should be the order forward runs them (ZeRO-3 gathers the
/// next unit while the current one computes); none may hold another.
struct UnitPolicy {
  /// Module paths as named_modules() spells them ("blocks.0"), or patterns in which "*" stands
  /// for one path element ("blocks.*": blocks.0, blocks.1, ... but not blocks.0.attn).
  std::vector<std::string> modules;
  /// When `modules` is empty: every submodule holding at least this many parameters that no
  /// unit below it holds, chosen from the leaves up (FSDP's size_based_auto_wrap_policy).
  /// 0, with no `modules`: no units.
  int64_t min_params = 0;
};

/// The unit paths `policy` picks in `root`, in named_modules() order. ConfigError naming the
/// entry when a path or pattern matches no submodule, and naming both when one unit holds
/// another.
std::vector<std::string> resolve_units(const torch::nn::Module& root, const UnitPolicy& policy);

/// Note [Your own model]: a models::Model around a user's module. Parallelisms reach a model
/// through two kinds of hook points (Note [Block hooks], Note [Module hooks]); a user's module
/// marks them by running its units, and any child a parallelism may replace, through
/// models::call(child, x): one line per call site, nothing else in the architecture. The
/// wrapper registers the module's own children, parameters and buffers under their own names
/// (state dicts and checkpoints keep the names the user declared, as Python loads them), names
/// the policy's units as its blocks, and puts a hook on each unit that runs it as run_block()
/// would, so ZeRO-3's gathers and activation checkpointing's recomputation wrap it. Its whole
/// forward runs through run_forward(), so ZeRO-3 gathers the parameters outside units per step.
/// A unit run without call() has no hook: under ZeRO-3 its parameters are released when it runs,
/// and forward names it.
///
/// Note [Pipeline units of your own model]: a pipeline cuts a model into stages between its
/// pipeline units (Note [Pipeline units]). A user's module names them as module paths (or "*"
/// patterns) whose forwards, run one after another through models::call(), are the whole
/// forward: x = call(embed, x); each block: x = call(block, x); return call(head, x). Together
/// they hold every parameter. A stage (hold_units) is the whole module with the other units
/// taken out: their parameters and buffers leave the state dict and give their memory back,
/// and models::call() passes its input through them, so the module's own forward runs the
/// stage's units alone. Anything forward computes between two units runs on every stage:
/// put it inside a unit.
class WrappedModule : public Model {
 public:
  WrappedModule(std::shared_ptr<torch::nn::Module> module,
                std::function<torch::Tensor(torch::Tensor)> forward, const UnitPolicy& units,
                TensorPlan tensor_plan = {}, const std::vector<std::string>& pipeline_units = {});
  ~WrappedModule() override;
  WrappedModule(const WrappedModule&) = delete;
  WrappedModule& operator=(const WrappedModule&) = delete;

  torch::Tensor forward(torch::Tensor x) override;
  std::vector<std::string> block_names() const override { return units_; }
  bool scopes_forward() const override { return true; }
  /// The plan wrap_module was given, for any tp (a parameter that tp does not divide is a
  /// ConfigError naming it when tensor parallelism splits it); ConfigError when it was given
  /// none.
  TensorPlan tensor_parallel_plan(int tp) const override;
  /// The pipeline units' paths, or {"model"} when wrap_module was given none.
  std::vector<std::string> unit_names() const override;
  /// Makes this the pipeline stage of pipeline units `range` (Note [Pipeline units of your own
  /// model]); ConfigError when the range is not one of the model's units, or when the model
  /// has no pipeline units.
  void hold_units(UnitRange range);
  /// The module as the user built it.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

 private:
  torch::nn::Module& submodule(const std::string& path) const;
  void check_stage_passed_through() const;

  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(torch::Tensor)> forward_;
  std::vector<std::string> units_;
  TensorPlan tensor_plan_;
  std::vector<std::string> pipeline_units_;
  std::vector<torch::nn::Module*> hooked_;   // units with an `around` hook
  std::vector<torch::nn::Module*> skipped_;  // pipeline units this stage passes through
  std::set<std::string> ran_units_;          // units and skipped pipeline units this forward ran
};

/// Wraps `module` (a shared_ptr to a module with forward(Tensor) -> Tensor) whose units
/// `units` picks, which tensor parallelism splits by `tensor_plan` (models/tensor_plan.h:
/// module paths or "*" patterns to column, row or vocabulary splits, as parallelize_module
/// takes them; each split module runs through models::call()), and which a pipeline cuts
/// between `pipeline_units` (paths or patterns; Note [Pipeline units of your own model]).
template <class M>
std::shared_ptr<WrappedModule> wrap_module(const std::shared_ptr<M>& module,
                                           const UnitPolicy& units = {},
                                           TensorPlan tensor_plan = {},
                                           const std::vector<std::string>& pipeline_units = {}) {
  M* m = module.get();
  return std::make_shared<WrappedModule>(
      module, [m](torch::Tensor x) { return m->forward(std::move(x)); }, units,
      std::move(tensor_plan), pipeline_units);
}
/// The same for a module holder (torch::nn::Sequential, a TORCH_MODULE of your own).
template <class M>
std::shared_ptr<WrappedModule> wrap_module(const torch::nn::ModuleHolder<M>& module,
                                           const UnitPolicy& units = {},
                                           TensorPlan tensor_plan = {},
                                           const std::vector<std::string>& pipeline_units = {}) {
  return wrap_module(module.ptr(), units, std::move(tensor_plan), pipeline_units);
}

}  // namespace dtorch::models
