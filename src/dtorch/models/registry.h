// Models by name, the way the command line and checkpoints refer to them ("mnist-cnn").
// Adding a model means adding one line to the table in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtorch/models/model.h"

namespace dtorch::models {

/// A freshly initialised model (initialised from the global torch generator, so seed it
/// first for reproducible weights). Throws ConfigError listing the known names when `name`
/// is not one of them.
std::shared_ptr<Model> make_model(const std::string& name);

/// Every name make_model accepts, sorted.
std::vector<std::string> model_names();

}  // namespace dtorch::models
