// Table of model constructors by name; one place to register a model for the CLI and tools.
// The table is a function-local static so lookups work during static initialisation too.
#include "dtorch/models/registry.h"

#include <functional>
#include <map>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/mnist.h"
#include "dtorch/models/resnet.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/models/vit.h"

namespace dtorch::models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(UnitRange)>;

/// Models of one unit: a pipeline cannot split them.
template <class M>
std::shared_ptr<Model> whole_only(const char* name, UnitRange u) {
  DTORCH_CHECK_T(ConfigError, u.begin == 0 && (u.end == -1 || u.end == 1), name,
                 " is one pipeline unit and cannot be split into stages: use --pp 1, or a ",
                 "model with blocks (gpt-*, resnet*, vit-*)");
  return std::make_shared<M>();
}

const std::map<std::string, Factory>& table() {
  static const std::map<std::string, Factory> t = {
      {"mnist-cnn", [](UnitRange u) { return whole_only<MnistCnn>("mnist-cnn", u); }},
      {"mnist-mlp", [](UnitRange u) { return whole_only<MnistMlp>("mnist-mlp", u); }},
      {"resnet18",
       [](UnitRange u) { return std::make_shared<ResNet>(ResNetConfig::resnet18(), u); }},
      {"resnet50",
       [](UnitRange u) { return std::make_shared<ResNet>(ResNetConfig::resnet50(), u); }},
      {"resnet-debug",
       [](UnitRange u) { return std::make_shared<ResNet>(ResNetConfig::debug(), u); }},
      {"vit-tiny",
       [](UnitRange u) { return std::make_shared<VisionTransformer>(ViTConfig::tiny(), u); }},
      {"vit-debug",
       [](UnitRange u) { return std::make_shared<VisionTransformer>(ViTConfig::debug(), u); }},
      {"gpt-small", [](UnitRange u) { return std::make_shared<GPT>(GPTConfig::small(), u); }},
      {"gpt-debug", [](UnitRange u) { return std::make_shared<GPT>(GPTConfig::debug(), u); }},
  };
  return t;
}

}  // namespace

std::shared_ptr<Model> make_model(const std::string& name, UnitRange units) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (const auto& n : model_names())
      known += (known.empty() ? "" : ", ") + n;
    DTORCH_FAIL(ConfigError, "unknown model '", name, "': choose one of ", known,
                " (--model NAME)");
  }
  return it->second(units);
}

namespace {

/// Builds the units of `name` one at a time (the largest allocation is one unit, never the
/// model) and calls f(unit index, unit) on each, leaving the global generator as it was.
template <class F>
void for_each_unit(const std::string& name, F&& f) {
  GeneratorStateGuard keep;
  const int n = make_model(name, {0, 1})->num_units();
  for (int i = 0; i < n; ++i)
    f(i, *make_model(name, {i, i + 1}));
}

}  // namespace

std::vector<PythonAlias> python_aliases(const std::string& name) {
  GeneratorStateGuard keep;
  return make_model(name, {0, 1})->python_aliases();
}

std::vector<UnitSize> model_units(const std::string& name) {
  std::vector<UnitSize> sizes;
  for_each_unit(name, [&](int i, Model& unit) {
    int64_t count = 0;
    for (const auto& p : unit.parameters())
      count += p.numel();
    sizes.push_back({unit.unit_names()[i], count});
  });
  return sizes;
}

int64_t model_parameters(const std::string& name) {
  std::set<std::string> seen;
  int64_t count = 0;
  for_each_unit(name, [&](int, Model& unit) {
    for (const auto& kv : unit.named_parameters())
      if (seen.insert(kv.key()).second) count += kv.value().numel();
  });
  return count;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& kv : table())
    names.push_back(kv.first);
  return names;
}

}  // namespace dtorch::models
