// Each pipeline unit of a model initialised from its own seed, so that a pipeline stage built
// alone gets the same weights as those units of the whole model (Note [Unit seeds]).
#pragma once

#include <ATen/core/Tensor.h>

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
  /// Draws the base from the global CPU generator.
  UnitSeeds();
  /// Reseeds the global CPU generator for unit `unit`: build and initialise it right after.
  void enter(int unit) const;
  /// Reseeds it past the last of `num_units` units.
  void finish(int num_units) const { enter(num_units); }

 private:
  uint64_t base_;
};

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
