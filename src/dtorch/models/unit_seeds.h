// Each pipeline unit of a model initialised from its own seed, so that a pipeline stage built
// alone gets the same weights as those units of the whole model (Note [Unit seeds]).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace dtorch::models {

/// Note [Unit seeds]: a model's constructor used to initialise every parameter from one
/// stream of the global generator, so a unit's weights depended on every unit built before
/// it and a pipeline stage built alone would get different weights. Instead the constructor
/// draws one number from the global CPU generator, then reseeds the generator from (that
/// number, unit index) before building and initialising each unit, and finally from (that
/// number, unit count). A unit's weights depend only on the global seed and its index; the
/// generator after construction is the same whichever units were built; a model seeded the
/// same way is reproducible as before.
class UnitSeeds {
 public:
  /// Draws the base from the global CPU generator, for the constructor of `model`, which
  /// registers each unit's modules before it enters the next unit.
  explicit UnitSeeds(const torch::nn::Module& model);
  /// Reseeds the global CPU generator for unit `unit`: build and initialise it right after.
  /// Under a DeferredStorage guard, first releases the storage of every parameter of the
  /// model built so far (Note [Deferred initialisation]).
  void enter(int unit) const;
  /// Reseeds it past the last of `num_units` units (releasing as enter() does).
  void finish(int num_units) const { enter(num_units); }

 private:
  const torch::nn::Module& model_;
  uint64_t base_;
};

/// Note [Deferred initialisation]: ZeRO-3 exists to train a model whose state does not fit
/// one rank, so no rank may ever hold the whole model, not even while building it. While a
/// DeferredStorage guard lives on a thread, a model built there releases each unit's
/// parameter storage as soon as the unit is built and initialised (UnitSeeds::enter does it
/// as the next unit starts), so building holds one unit at a time and the model comes out
/// with every parameter's name, shape and dtype but no memory. Its values are not lost: by
/// Note [Unit seeds] unit k built alone from the same generator state has exactly the values
/// unit k had in the whole model, so ZeRO-3 builds the units again one at a time
/// (Model::DeferredInit, models::make_deferred_model) and each rank copies only the elements
/// it owns into its shard. Building costs the largest unit, twice over (skeleton and
/// rebuild), instead of the model; the shards equal those of the unsharded initialisation.
class DeferredStorage {
 public:
  DeferredStorage();
  ~DeferredStorage();
  DeferredStorage(const DeferredStorage&) = delete;
  DeferredStorage& operator=(const DeferredStorage&) = delete;

 private:
  bool outer_;
};

/// Releases the storage of every parameter of `module` that still holds memory (Note
/// [Deferred initialisation]).
void release_parameters(const torch::nn::Module& module);

/// The global CPU generator's state (a copy), and setting it: what a checkpoint saves and
/// restores, and what builds a model's units again (Note [Deferred initialisation]).
at::Tensor cpu_generator_state();
void set_cpu_generator_state(const at::Tensor& state);

/// Restores the global CPU generator's state when destroyed: for building models whose
/// weights are about to be overwritten (counting a unit's parameters, loading a checkpoint)
/// without changing what the generator gives next.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard();
  ~GeneratorStateGuard();
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  at::Tensor state_;
};

}  // namespace dtorch::models
