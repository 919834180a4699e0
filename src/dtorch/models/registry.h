// Models by name, the way the command line and checkpoints refer to them ("mnist-cnn").
// Adding a model means adding one line to the table in registry.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::models {

/// A freshly initialised model (initialised from the global torch generator, so seed it
/// first for reproducible weights), or with `units` only those of its pipeline units (Note
/// [Pipeline units]); an image model is built for `input` (channels, side, classes).
/// Throws ConfigError listing the known names when `name` is not one of them.
std::shared_ptr<Model> make_model(const std::string& name, UnitRange units = {},
                                  const ImageInput& input = {});

/// Model `name` with every parameter's name, shape and dtype but no memory, built holding one
/// unit at a time; its deferred_init() builds the units again to give ZeRO-3 or tensor
/// parallelism the values make_model would have given from the same generator state (Note
/// [Deferred initialisation]). zero::shard with stage 3 and tp::parallelize initialise it;
/// DDP and ZeRO-1/2 refuse it (after tp::parallelize they take it).
std::shared_ptr<Model> make_deferred_model(const std::string& name, const ImageInput& input = {});

/// Moves `model`'s parameters and buffers to `device`, each parameter keeping its TensorImpl
/// (as Module::to does). A model built without memory stays without: its parameters become
/// tensors of `device` holding no bytes, which ZeRO-3 fills (Note [Deferred initialisation]).
void to_device(Model& model, at::Device device);

/// Builds the units of `name` one at a time (the largest allocation is one unit, never the
/// model), each from the global generator's current state, and calls f(unit index, unit) on
/// each; leaves the generator as it was.
void for_each_unit(const std::string& name, const ImageInput& input,
                   const std::function<void(int, Model&)>& f);

/// A pipeline unit's name and parameter count (a GPT head counts its copy of the tied
/// embedding).
struct UnitSize {
  std::string name;
  int64_t parameters = 0;
};
/// Parameters of the whole model `name`, each counted once (a GPT's tied embedding once),
/// counted unit by unit as model_units does.
int64_t model_parameters(const std::string& name, const ImageInput& input = {});

/// The units of model `name` with their sizes, built one at a time (the whole model is
/// never allocated). Leaves the global generator as it was.
std::vector<UnitSize> model_units(const std::string& name, const ImageInput& input = {});

/// The python_aliases() of model `name`, without building it.
std::vector<PythonAlias> python_aliases(const std::string& name);

/// Every name make_model accepts, sorted.
std::vector<std::string> model_names();

/// Adds a model of your own under `name` (Note [Your own model]), which make_model and
/// train::parallelize then build as they build dtorch's: `make` builds it whole, initialised
/// from the global generator (usually models::wrap_module around your module), and a
/// pipeline stage is that model with the other pipeline units taken out
/// (WrappedModule::hold_units), so its weights are those of the whole model from the same
/// seed. Building a stage, or initialising ZeRO-3's or tensor parallelism's shards, builds
/// the whole model once per unit in host memory. Call it before the model is first used;
/// ConfigError when `name` is taken.
void register_model(const std::string& name, std::function<std::shared_ptr<Model>()> make);

}  // namespace dtorch::models
