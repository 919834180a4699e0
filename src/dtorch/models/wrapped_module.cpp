// A user's module as a models::Model (Note [Your own model]): its units by policy, and the hooks
// that run each unit as run_block() runs a built-in model's blocks.
#include "dtorch/models/wrapped_module.h"

#include <map>
#include <set>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/tensor_plan.h"

namespace dtorch::models {
namespace {

bool holds(const std::string& outer, const std::string& inner) {
  return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
         inner[outer.size()] == '.';
}

// A few of the paths a pattern could have named, for an error message.
std::string some_paths(const std::vector<std::string>& paths) {
  std::string out;
  for (size_t i = 0; i < paths.size() && i < 6; ++i)
    out += (i ? ", " : "") + paths[i];
  return paths.size() > 6 ? out + ", ..." : out;
}

// FSDP's size-based policy: post-order, a module whose parameters outside units below it
// number at least `min` becomes a unit. Returns those parameters' count for the parent.
int64_t by_size(const torch::nn::Module& m, const std::string& path, int64_t min,
                std::set<std::string>& units) {
  int64_t own = 0;
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    own += p.value().numel();
  for (const auto& child : m.named_children())
    own +=
        by_size(*child.value(), path.empty() ? child.key() : path + "." + child.key(), min, units);
  if (!path.empty() && own >= min) {
    units.insert(path);
    return 0;
  }
  return own;
}

}  // namespace

std::vector<std::string> resolve_units(const torch::nn::Module& root, const UnitPolicy& policy) {
  DTORCH_CHECK_T(ConfigError, policy.min_params >= 0, "UnitPolicy::min_params is ",
                 policy.min_params, "; give a parameter count of 0 (no units by size) or more");
  std::vector<std::string> paths;
  for (const auto& kv : root.named_modules("", /*include_self=*/false))
    paths.push_back(kv.key());
  std::vector<bool> picked(paths.size(), false);
  if (!policy.modules.empty()) {
    for (const std::string& pattern : policy.modules) {
      bool any = false;
      for (size_t i = 0; i < paths.size(); ++i) {
        if (!module_path_matches(pattern, paths[i])) continue;
        picked[i] = true;
        any = true;
      }
      DTORCH_CHECK_T(ConfigError, any, "unit '", pattern,
                     "' names no submodule of the model; its submodules are ", some_paths(paths),
                     " (\"*\" stands for one path element, as in \"blocks.*\")");
    }
  } else if (policy.min_params > 0) {
    std::set<std::string> big;
    by_size(root, "", policy.min_params, big);
    for (size_t i = 0; i < paths.size(); ++i)
      picked[i] = big.count(paths[i]) > 0;
  }
  std::vector<std::string> units;  // in named_modules() order, whichever rule picked them
  for (size_t i = 0; i < paths.size(); ++i)
    if (picked[i]) units.push_back(paths[i]);
  for (size_t i = 0; i < units.size(); ++i)
    for (size_t j = 0; j < units.size(); ++j)
      DTORCH_CHECK_T(ConfigError, !holds(units[i], units[j]), "unit ", units[i], " holds unit ",
                     units[j], "; units must not nest: pick one of the two levels");
  return units;
}

WrappedModule::WrappedModule(std::shared_ptr<torch::nn::Module> module,
                             std::function<torch::Tensor(torch::Tensor)> forward,
                             const UnitPolicy& units, TensorPlan tensor_plan)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      tensor_plan_(std::move(tensor_plan)) {
  DTORCH_CHECK_T(ConfigError, module_ && forward_, "wrap_module: no module given");
  // The module's own names, so that parameter names stay those the user declared.
  for (const auto& kv : module_->named_children())
    register_module(kv.key(), kv.value());
  for (const auto& kv : module_->named_parameters(/*recurse=*/false))
    register_parameter(kv.key(), kv.value(), kv.value().requires_grad());
  for (const auto& kv : module_->named_buffers(/*recurse=*/false))
    register_buffer(kv.key(), kv.value());
  units_ = resolve_units(*module_, units);

  std::map<std::string, std::shared_ptr<torch::nn::Module>> by_path;
  for (const auto& kv : module_->named_modules("", /*include_self=*/false))
    by_path[kv.key()] = kv.value();
  for (const std::string& unit : units_) {
    torch::nn::Module& m = *by_path.at(unit);
    auto existing = module_hooks(m);
    ModuleHooks hooks = existing ? *existing : ModuleHooks{};
    // The wrapper clears these hooks before it goes, so `this` outlives every call of them.
    hooks.around = [this, unit](torch::Tensor x,
                                const std::function<torch::Tensor(torch::Tensor)>& run) {
      return run_block(unit, std::move(x), run);
    };
    set_module_hooks(m, std::move(hooks));
    hooked_.push_back(&m);
  }
}

WrappedModule::~WrappedModule() {
  for (torch::nn::Module* m : hooked_) {
    auto existing = module_hooks(*m);
    if (!existing) continue;
    ModuleHooks rest = *existing;
    rest.around = nullptr;
    if (rest.pre || rest.forward || rest.post)
      set_module_hooks(*m, std::move(rest));
    else
      clear_module_hooks(*m);
  }
}

TensorPlan WrappedModule::tensor_parallel_plan(int /*tp*/) const {
  DTORCH_CHECK_T(ConfigError, !tensor_plan_.empty(),
                 "tensor parallelism: this wrapped module has no plan; give wrap_module one (the "
                 "modules to split by columns and by rows: docs/your-model.md)");
  return tensor_plan_;
}

torch::Tensor WrappedModule::forward(torch::Tensor x) {
  return run_forward(std::move(x), [this](torch::Tensor in) { return forward_(std::move(in)); });
}

}  // namespace dtorch::models
