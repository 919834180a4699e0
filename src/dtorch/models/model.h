// The interface every dtorch model implements: a torch::nn::Module with one tensor in and one
// tensor out, so trainers and parallel wrappers can drive any model the same way.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/core/error.h"
#include "dtorch/models/image_input.h"
#include "dtorch/models/tensor_plan.h"
#include "dtorch/models/workload.h"

namespace dtorch::models {

/// Units [begin, end) of a model's pipeline units; end -1 means to the last one.
struct UnitRange {
  int begin = 0;
  int end = -1;
};

/// A second name Python's module of the same model gives one of its parameters. PyTorch ties
/// weights by assignment (nanoGPT: lm_head.weight = transformer.wte.weight), so its
/// state_dict() lists the tensor under both names, and torch.save writes one storage under
/// two keys; dtorch registers each parameter once (Note [Tied embedding] in gpt.h).
struct PythonAlias {
  std::string alias;  ///< "lm_head.weight"
  std::string name;   ///< the parameter's name here: "transformer.wte.weight"
};

/// A model: architecture only (no training or communication code). Parameters and buffers
/// are registered under the names PyTorch's Python module of the same model uses, so state
/// dicts move between C++ and Python unchanged.
///
/// Note [Block hooks]: sharded data parallelism (FSDP, ZeRO-3) keeps each rank's parameters
/// as shards and must gather a block's full parameters right before the block runs and free
/// them right after; Python does this with forward pre-hooks and hooks on submodules.
/// LibTorch modules have no hooks, so a model names its repeating blocks (block_names()) and
/// runs each of them through run_block(), which calls the hooks installed with
/// set_block_hooks() around it. The parameters outside blocks (embeddings, a final norm, a
/// classifier head) are used at both ends of forward, so a model also runs its whole forward
/// through run_forward(): sharding gathers them as forward begins and frees them once their
/// backward is done (FSDP's root). The parallel code stays a function applied to the model;
/// the model only marks where its blocks, and its forward, begin and end.
class Model : public torch::nn::Module {
 public:
  /// Maps a batch of inputs to a batch of outputs (logits for classifiers).
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  /// Module paths, as named_modules() spells them ("transformer.h.0", "layer1"), of the
  /// model's repeating blocks, in forward order: the units a sharding wrap policy may gather
  /// one at a time. Empty: no such blocks.
  virtual std::vector<std::string> block_names() const { return {}; }

  /// What forward() takes. false: float images B x C x H x W (B x 1 x 28 x 28 for the
  /// built-in models), output B x classes. true: int64 token ids B x T, output logits
  /// B x T x vocab (language models).
  virtual bool takes_tokens() const { return false; }
  /// For models that take tokens: the longest sequence forward() accepts (a GPT's
  /// block_size); 0 otherwise.
  virtual int64_t max_sequence_length() const { return 0; }

  /// Note [Pipeline units]: a model is a chain of units (GPT: "embedding", its blocks,
  /// "head"; ResNet: "stem", its stages, "head"; ViT: "embedding", its blocks, "head"), each
  /// a function of the previous one's output. Built with a UnitRange, a model holds only the
  /// parameters of those units and forward() maps the previous unit's output to its last
  /// unit's: a pipeline stage, which never allocates the rest of the model. Parameter names
  /// stay those of the whole model, so stages' state dicts join into the whole one. Each
  /// unit is initialised from its own seed (Note [Unit seeds]), so a stage's weights equal
  /// those units' weights in the whole model built from the same seed.
  /// Every unit's name, in forward order, whichever range this instance holds.
  virtual std::vector<std::string> unit_names() const { return {"model"}; }
  /// The units this instance holds (end resolved).
  UnitRange units() const { return {units_.begin, units_.end < 0 ? num_units() : units_.end}; }
  int num_units() const { return static_cast<int>(unit_names().size()); }
  /// Whether this instance holds unit i.
  bool holds_unit(int i) const { return i >= units().begin && i < units().end; }
  /// Whether it holds every unit (not a pipeline stage).
  bool whole() const { return units().begin == 0 && units().end == num_units(); }

  /// The parameters Python's module of this model also lists under a second name; state
  /// dicts written for torch.load carry those names too (checkpoint::with_python_aliases), and
  /// state dicts read here may.
  virtual std::vector<PythonAlias> python_aliases() const { return {}; }

  /// How tensor parallelism splits this model over `tp` ranks (tensor_plan.h): the rules for
  /// the whole model, by its module paths (a pipeline stage keeps those of its modules). A
  /// model that has none says so; ConfigError as well when `tp` does not divide what a rule
  /// splits.
  virtual TensorPlan tensor_parallel_plan(int /*tp*/) const {
    DTORCH_FAIL(ConfigError, "tensor parallelism has plans for the transformers (gpt-*, vit-*); ",
                "this model has none: train it with data parallelism (--tp 1) or ZeRO");
  }

  /// What context parallelism needs of a model besides its attention cores (Note [Attention
  /// core]): where its sequence is split, and the number of attention heads. A model whose
  /// input is the sequence (gpt) names the module that embeds positions 0..T-1, whose input is
  /// mapped to the positions of the rank's tokens, and its batches are split before it runs. A
  /// model that makes its sequence inside (vit: a class token and the patches) names the module
  /// whose input is the first to be split and the one whose input is gathered whole again, and
  /// its sequence's length (Note [Padded sequences]).
  struct ContextPlan {
    int64_t heads = 0;
    std::string positions;
    std::string split, gather;
    int64_t tokens = 0;
  };
  /// The model's ContextPlan; a model without one says so.
  virtual ContextPlan context_parallel_plan() const {
    DTORCH_FAIL(ConfigError, "context parallelism has plans for the transformers (gpt-*, vit-*); ",
                "this model has none: train it without --cp");
  }

  /// The whole model's Workload (its shape, what its blocks keep, its units' sizes), whichever
  /// units this instance holds; a model that is not a transformer reports none.
  virtual Workload workload() const { return {}; }

  /// How a model built under models::DeferredStorage (its parameters hold no memory) gets
  /// its values (Note [Deferred initialisation]); models::make_deferred_model sets it.
  struct DeferredInit {
    /// The global CPU generator's state the model was built from.
    at::Tensor generator_state;
    /// Builds each unit alone, in order, from the generator's current state, and calls its
    /// argument on it: unit k's parameters are those of this model's unit k, by name.
    std::function<void(const std::function<void(Model& unit)>&)> for_each_unit;
  };
  void set_deferred_init(DeferredInit d) { deferred_ = std::move(d); }
  /// Whether the parameters hold no memory yet: only ZeRO-3 and tensor parallelism (which
  /// then clears it) take such a model.
  bool deferred() const { return static_cast<bool>(deferred_.for_each_unit); }
  const DeferredInit& deferred_init() const { return deferred_; }

  /// Called around each block's forward (see run_block and Note [Block hooks]), and around
  /// the whole forward of a model that scopes_forward() (see run_forward).
  struct BlockHooks {
    /// Runs just before block `block`'s forward; may be empty.
    std::function<void(const std::string& block)> before;
    /// Runs just after it with the block's output; returns the tensor the model continues
    /// with (return `out` to leave it unchanged). May be empty.
    std::function<torch::Tensor(const std::string& block, torch::Tensor out)> after;
    /// Runs as forward() begins; may be empty.
    std::function<void()> forward_begin;
    /// Runs as forward() ends, with its output; returns what forward() returns. May be empty.
    std::function<torch::Tensor(torch::Tensor out)> forward_end;
  };
  /// Whether forward() runs its whole body through run_forward(), so the hooks see where a
  /// forward begins and ends. ZeRO-3 then gathers the parameters outside blocks (its root
  /// unit) when forward begins and releases them after their backward; for a model that does
  /// not, they stay gathered all the time (Note [Block hooks]).
  virtual bool scopes_forward() const { return false; }
  /// Replaces the hooks (an empty BlockHooks removes them). Not thread-safe against a
  /// concurrent forward.
  void set_block_hooks(BlockHooks hooks) { hooks_ = std::move(hooks); }
  const BlockHooks& block_hooks() const { return hooks_; }

  /// Runs a block's forward `f` on `x` in place of f(x), between the block hooks; activation
  /// checkpointing uses it to keep only the block's input and run `f` again in backward
  /// (Note [Activation checkpointing]). `f` stays callable after the forward returns.
  using BlockRunner = std::function<torch::Tensor(const std::string& block, torch::Tensor x,
                                                  std::function<torch::Tensor(torch::Tensor)> f)>;
  /// Replaces the runner (an empty one runs f(x) directly).
  void set_block_runner(BlockRunner runner) { runner_ = std::move(runner); }
  const BlockRunner& block_runner() const { return runner_; }

 protected:
  /// Records the range a pipeline stage's constructor was given; ConfigError when it is empty
  /// or outside the model's units.
  void set_units(UnitRange r) {
    const int n = num_units(), end = r.end < 0 ? n : r.end;
    DTORCH_CHECK_T(ConfigError, r.begin >= 0 && r.begin < end && end <= n, "units [", r.begin, ", ",
                   end, ") are not a range of this model's ", n, " pipeline units");
    units_ = {r.begin, end};
  }

  /// Runs the whole forward f(x) between the forward hooks: forward_begin(), out = f(x),
  /// out = forward_end(out). A model that does this says so with scopes_forward(). When f
  /// throws, forward_end is not called.
  template <class F>
  torch::Tensor run_forward(torch::Tensor x, F&& f) {
    if (hooks_.forward_begin) hooks_.forward_begin();
    torch::Tensor out = std::forward<F>(f)(std::move(x));
    return hooks_.forward_end ? hooks_.forward_end(std::move(out)) : out;
  }

  /// Runs f(x) as block `name` with the hooks around it: before(name), out = f(x) (through
  /// the block runner, if one is set), out = after(name, out). Models run every block listed
  /// in block_names() through this, and nothing else. When f throws, `after` is not called.
  /// `f` captures by value what it needs (the model's `this`, a block index): the runner may
  /// call it again during backward, after this forward has returned.
  template <class F>
  torch::Tensor run_block(const std::string& name, torch::Tensor x, F&& f) {
    if (hooks_.before) hooks_.before(name);
    torch::Tensor out = runner_ ? runner_(name, std::move(x), std::forward<F>(f))
                                : std::forward<F>(f)(std::move(x));
    if (hooks_.after) out = hooks_.after(name, std::move(out));
    return out;
  }

 private:
  BlockHooks hooks_;
  BlockRunner runner_;
  UnitRange units_;
  DeferredInit deferred_;
};

/// ConfigError when `module` is a Model built without memory (models::make_deferred_model),
/// which only ZeRO-3 and tensor parallelism initialise; `who` names what was applied to it
/// ("DDP").
inline void require_memory(const torch::nn::Module& module, const std::string& who) {
  auto* m = dynamic_cast<const Model*>(&module);
  DTORCH_CHECK_T(
      ConfigError, !m || !m->deferred(), who,
      ": the model was built without memory (models::make_deferred_model), which "
      "only ZeRO-3 and tensor parallelism initialise; build it with models::make_model for ",
      who);
}

}  // namespace dtorch::models
