// Table of model constructors by name; one place to register a model for the CLI and tools.
// The table is a function-local static so lookups work during static initialisation too.
#include "dtorch/models/registry.h"

#include <functional>
#include <map>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/core/storage.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/mnist.h"
#include "dtorch/models/resnet.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/models/vit.h"
#include "dtorch/models/wrapped_module.h"

namespace dtorch::models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(UnitRange, const ImageInput&)>;

/// A registered model: how to build (part of) it, and the Python aliases of its state dict,
/// known without building it (a unit of gpt-small is tens of megabytes).
struct Entry {
  Factory make;
  std::vector<PythonAlias> (*aliases)() = [] { return std::vector<PythonAlias>{}; };
};

/// Models of one unit: a pipeline cannot split them.
template <class M>
std::shared_ptr<Model> whole_only(const char* name, UnitRange u, const ImageInput& in) {
  DTORCH_CHECK_T(ConfigError, u.begin == 0 && (u.end == -1 || u.end == 1), name,
                 " is one pipeline unit and cannot be split into stages: use --pp 1, or a ",
                 "model with blocks (gpt-*, resnet*, vit-*)");
  return std::make_shared<M>(in);
}

ResNetConfig resnet_for(ResNetConfig c, const ImageInput& in) {
  c.in_channels = in.channels;
  c.num_classes = in.classes;
  c.imagenet_stem = in.size >= ResNetConfig::kImageNetStemFrom;
  return c;
}

ViTConfig vit_for(ViTConfig c, const ImageInput& in) {
  c.in_channels = in.channels;
  c.image_size = in.size;
  c.num_classes = in.classes;
  return c;
}

std::map<std::string, Entry>& table() {
  static std::map<std::string, Entry> t = {
      {"mnist-cnn", {[](UnitRange u, const ImageInput& in) {
         return whole_only<MnistCnn>("mnist-cnn", u, in);
       }}},
      {"mnist-mlp", {[](UnitRange u, const ImageInput& in) {
         return whole_only<MnistMlp>("mnist-mlp", u, in);
       }}},
      {"resnet18", {[](UnitRange u, const ImageInput& in) {
         return std::make_shared<ResNet>(resnet_for(ResNetConfig::resnet18(), in), u);
       }}},
      {"resnet50", {[](UnitRange u, const ImageInput& in) {
         return std::make_shared<ResNet>(resnet_for(ResNetConfig::resnet50(), in), u);
       }}},
      {"resnet-debug", {[](UnitRange u, const ImageInput& in) {
         return std::make_shared<ResNet>(resnet_for(ResNetConfig::debug(), in), u);
       }}},
      {"vit-tiny", {[](UnitRange u, const ImageInput& in) {
         return std::make_shared<VisionTransformer>(vit_for(ViTConfig::tiny(), in), u);
       }}},
      {"vit-debug", {[](UnitRange u, const ImageInput& in) {
         return std::make_shared<VisionTransformer>(vit_for(ViTConfig::debug(), in), u);
       }}},
      {"gpt-large",
       {[](UnitRange u, const ImageInput&) { return std::make_shared<GPT>(GPTConfig::large(), u); },
        &GPT::tied_aliases}},
      {"gpt-small",
       {[](UnitRange u, const ImageInput&) { return std::make_shared<GPT>(GPTConfig::small(), u); },
        &GPT::tied_aliases}},
      {"gpt-xl",
       {[](UnitRange u, const ImageInput&) { return std::make_shared<GPT>(GPTConfig::xl(), u); },
        &GPT::tied_aliases}},
      {"gpt-debug",
       {[](UnitRange u, const ImageInput&) { return std::make_shared<GPT>(GPTConfig::debug(), u); },
        &GPT::tied_aliases}},
      {"gpt-long",
       {[](UnitRange u, const ImageInput&) {
          return std::make_shared<GPT>(GPTConfig::long_debug(), u);
        },
        &GPT::tied_aliases}},
  };
  return t;
}

const Entry& entry(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (const auto& n : model_names())
      known += (known.empty() ? "" : ", ") + n;
    DTORCH_FAIL(ConfigError, "unknown model '", name, "': choose one of ", known,
                " (--model NAME)");
  }
  return it->second;
}

}  // namespace

std::shared_ptr<Model> make_model(const std::string& name, UnitRange units,
                                  const ImageInput& input) {
  DTORCH_CHECK_T(ConfigError, input.channels >= 1 && input.size >= 1 && input.classes >= 2,
                 "an image model needs at least 1 channel, 1 pixel and 2 classes (got ",
                 input.channels, " channel(s), ", input.size, "x", input.size, " pixels, ",
                 input.classes, " class(es))");
  return entry(name).make(units, input);
}

void for_each_unit(const std::string& name, const ImageInput& input,
                   const std::function<void(int, Model&)>& f) {
  GeneratorStateGuard keep;
  int n = 0;
  {
    GeneratorStateGuard same_start;  // Note [Unit seeds]: every unit from the same state
    DeferredStorage no_memory;       // only to count the units
    n = make_model(name, {0, 1}, input)->num_units();
  }
  for (int i = 0; i < n; ++i) {
    GeneratorStateGuard same_start;  // Note [Unit seeds]: every unit from the same state
    f(i, *make_model(name, {i, i + 1}, input));
  }
}

std::shared_ptr<Model> make_deferred_model(const std::string& name, const ImageInput& input) {
  // Note [Returning released memory]: glibc would keep each released unit in its heap, below
  // the next one's, and the skeleton of gpt-large would hold 1.5 GiB of freed memory. ZeRO-3
  // sets Reuse again when it shards the model.
  set_freed_memory(FreedMemory::Return);
  Model::DeferredInit d;
  d.generator_state = cpu_generator_state();
  d.for_each_unit = [name, input](const std::function<void(Model&)>& f) {
    for_each_unit(name, input, [&](int, Model& unit) { f(unit); });
  };
  std::shared_ptr<Model> model;
  {
    DeferredStorage no_memory;
    model = make_model(name, {}, input);
  }
  release_parameters(*model);  // a model without units (mnist-cnn) is built whole
  model->set_deferred_init(std::move(d));
  return model;
}

void to_device(Model& model, at::Device device) {
  if (!model.deferred()) {
    model.to(device);
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.device() == device) continue;
    at::Tensor moved = at::empty(p.sizes(), p.options().device(device));
    release_storage(moved);  // one parameter's bytes at a time, then none
    p.set_data(moved);
  }
  for (auto& b : model.buffers())
    if (b.device() != device) b.set_data(b.to(device));
}

std::vector<PythonAlias> python_aliases(const std::string& name) {
  return entry(name).aliases();
}

std::vector<UnitSize> model_units(const std::string& name, const ImageInput& input) {
  std::vector<UnitSize> sizes;
  for_each_unit(name, input, [&](int i, Model& unit) {
    int64_t count = 0;
    for (const auto& p : unit.parameters())
      count += p.numel();
    sizes.push_back({unit.unit_names()[i], count});
  });
  return sizes;
}

int64_t model_parameters(const std::string& name, const ImageInput& input) {
  std::set<std::string> seen;
  int64_t count = 0;
  for_each_unit(name, input, [&](int, Model& unit) {
    for (const auto& kv : unit.named_parameters())
      if (seen.insert(kv.key()).second) count += kv.value().numel();
  });
  return count;
}

void register_model(const std::string& name, std::function<std::shared_ptr<Model>()> make) {
  DTORCH_CHECK_T(ConfigError, !name.empty() && make, "register_model: give a name and a factory");
  DTORCH_CHECK_T(ConfigError, table().count(name) == 0, "register_model: a model named '", name,
                 "' exists already; give yours another name");
  table()[name] = {[name, make](UnitRange u, const ImageInput&) {
    std::shared_ptr<Model> m = make();
    DTORCH_CHECK_T(ConfigError, m != nullptr, "register_model: the factory of ", name,
                   " returned no model");
    const int n = m->num_units();
    if (u.begin == 0 && (u.end == -1 || u.end == n)) return m;
    auto* wrapped = dynamic_cast<WrappedModule*>(m.get());
    DTORCH_CHECK_T(ConfigError, wrapped != nullptr, "a pipeline stage of ", name,
                   " needs it built by models::wrap_module with pipeline units "
                   "(docs/your-model.md)");
    wrapped->hold_units(u);
    return m;
  }};
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& kv : table())
    names.push_back(kv.first);
  return names;
}

}  // namespace dtorch::models
