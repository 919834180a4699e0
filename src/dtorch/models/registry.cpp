// Table of model constructors by name; one place to register a model for the CLI and tools.
// The table is a function-local static so lookups work during static initialisation too.
#include "dtorch/models/registry.h"

#include <functional>
#include <map>

#include "dtorch/core/error.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/mnist.h"
#include "dtorch/models/resnet.h"
#include "dtorch/models/vit.h"

namespace dtorch::models {
namespace {

using Factory = std::function<std::shared_ptr<Model>()>;

const std::map<std::string, Factory>& table() {
  static const std::map<std::string, Factory> t = {
      {"mnist-cnn", [] { return std::make_shared<MnistCnn>(); }},
      {"mnist-mlp", [] { return std::make_shared<MnistMlp>(); }},
      {"resnet18", [] { return std::make_shared<ResNet>(ResNetConfig::resnet18()); }},
      {"resnet50", [] { return std::make_shared<ResNet>(ResNetConfig::resnet50()); }},
      {"resnet-debug", [] { return std::make_shared<ResNet>(ResNetConfig::debug()); }},
      {"vit-tiny", [] { return std::make_shared<VisionTransformer>(ViTConfig::tiny()); }},
      {"vit-debug", [] { return std::make_shared<VisionTransformer>(ViTConfig::debug()); }},
      {"gpt-small", [] { return std::make_shared<GPT>(GPTConfig::small()); }},
      {"gpt-debug", [] { return std::make_shared<GPT>(GPTConfig::debug()); }},
  };
  return t;
}

}  // namespace

std::shared_ptr<Model> make_model(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (const auto& n : model_names())
      known += (known.empty() ? "" : ", ") + n;
    DTORCH_FAIL(ConfigError, "unknown model '", name, "': choose one of ", known,
                " (--model NAME)");
  }
  return it->second();
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& kv : table())
    names.push_back(kv.first);
  return names;
}

}  // namespace dtorch::models
