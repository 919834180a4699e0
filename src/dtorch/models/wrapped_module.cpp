// A user's module as a models::Model (Note [Your own model]): its units by policy, and the hooks
// that run each unit as run_block() runs a built-in model's blocks.
#include "dtorch/models/wrapped_module.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "dtorch/core/error.h"
#include "dtorch/core/storage.h"
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
                             const UnitPolicy& units, TensorPlan tensor_plan,
                             const std::vector<std::string>& pipeline_units)
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
  if (!pipeline_units.empty()) {
    UnitPolicy chain;
    chain.modules = pipeline_units;
    pipeline_units_ = resolve_units(*module_, chain);
    for (const auto& kv : module_->named_parameters()) {
      const bool held = std::any_of(pipeline_units_.begin(), pipeline_units_.end(),
                                    [&](const std::string& u) { return holds(u, kv.key()); });
      DTORCH_CHECK_T(ConfigError, held, "parameter ", kv.key(),
                     " is in no pipeline unit; the pipeline units must hold every parameter: "
                     "add its module to them");
    }
    // A stage gives back the memory of the units it does not hold: no two units may share it.
    std::map<const void*, std::string> owner;  // storage -> "unit: parameter"
    for (const std::string& unit : pipeline_units_) {
      for (const auto& kv : submodule(unit).named_parameters()) {
        const std::string mine = unit + "." + kv.key();
        auto [it, fresh] = owner.emplace(kv.value().storage().unsafeGetStorageImpl(), mine);
        DTORCH_CHECK_T(ConfigError, fresh || holds(unit, it->second), "parameters ", it->second,
                       " and ", mine,
                       " share their memory (tied weights) but lie in different pipeline units; "
                       "a pipeline cannot cut between them: put both modules in one unit");
      }
    }
  }

  for (const std::string& unit : units_) {
    torch::nn::Module& m = submodule(unit);
    // The wrapper takes the hook off before it goes, so `this` outlives every call of it.
    edit_module_hooks(m, [this, unit](ModuleHooks& h) {
      h.around = [this, unit](torch::Tensor x,
                              const std::function<torch::Tensor(torch::Tensor)>& run) {
        ran_units_.insert(unit);
        return run_block(unit, std::move(x), run);
      };
    });
    hooked_.push_back(&m);
  }
}

WrappedModule::~WrappedModule() {
  for (torch::nn::Module* m : hooked_)
    edit_module_hooks(*m, [](ModuleHooks& h) { h.around = nullptr; });
  for (torch::nn::Module* m : skipped_)
    edit_module_hooks(*m, [](ModuleHooks& h) { h.forward = nullptr; });
}

torch::nn::Module& WrappedModule::submodule(const std::string& path) const {
  for (const auto& kv : module_->named_modules("", /*include_self=*/false))
    if (kv.key() == path) return *kv.value();
  DTORCH_FAIL(ConfigError, "the wrapped module has no submodule ", path);
}

std::vector<std::string> WrappedModule::unit_names() const {
  return pipeline_units_.empty() ? std::vector<std::string>{"model"} : pipeline_units_;
}

void WrappedModule::hold_units(UnitRange range) {
  DTORCH_CHECK_T(ConfigError, !pipeline_units_.empty() || (range.begin == 0 && range.end <= 1),
                 "a pipeline cannot cut this wrapped module: give wrap_module its pipeline "
                 "units, the modules its forward runs one after another (docs/your-model.md)");
  DTORCH_CHECK_T(ConfigError, whole(), "hold_units: this wrapped module is a stage already");
  set_units(range);
  for (int k = 0; k < num_units(); ++k) {
    if (holds_unit(k)) continue;
    const std::string& path = pipeline_units_[k];
    torch::nn::Module& m = submodule(path);
    for (const auto& p : m.parameters())
      if (holds_storage(p)) release_storage(p);
    for (const auto& b : m.buffers())
      if (holds_storage(b)) release_storage(b);
    const size_t dot = path.rfind('.');
    torch::nn::Module& parent = dot == std::string::npos ? static_cast<torch::nn::Module&>(*this)
                                                         : submodule(path.substr(0, dot));
    parent.unregister_module(dot == std::string::npos ? path : path.substr(dot + 1));
    // Its blocks leave with it.
    units_.erase(std::remove_if(units_.begin(), units_.end(),
                                [&](const std::string& u) { return u == path || holds(path, u); }),
                 units_.end());
    edit_module_hooks(m, [this, path](ModuleHooks& h) {
      h.around = nullptr;
      h.forward = [this, path](torch::Tensor x) {
        ran_units_.insert(path);
        return x;
      };
    });
    skipped_.push_back(&m);
  }
}

TensorPlan WrappedModule::tensor_parallel_plan(int /*tp*/) const {
  DTORCH_CHECK_T(ConfigError, !tensor_plan_.empty(),
                 "tensor parallelism: this wrapped module has no plan; give wrap_module one (the "
                 "modules to split by columns and by rows: docs/your-model.md)");
  return tensor_plan_;
}

torch::Tensor WrappedModule::forward(torch::Tensor x) {
  ran_units_.clear();
  torch::Tensor out;
  try {
    out = run_forward(std::move(x), [this](torch::Tensor in) { return forward_(std::move(in)); });
  } catch (const c10::Error& e) {
    // A parameter without memory: a unit run without models::call() (ZeRO-3 had not gathered
    // it; a stage had taken it out). Name the unit rather than LibTorch's allocation.
    const std::string what = e.what();
    if (what.find("data is not allocated") != std::string::npos ||
        what.find("storage of size 0") != std::string::npos) {
      for (const std::string& unit : units_)
        DTORCH_CHECK_T(ConfigError, ran_units_.count(unit), "unit ", unit,
                       " ran without models::call(): its parameters hold no memory outside it "
                       "(ZeRO-3 gathers them there), so forward runs it as x = "
                       "models::call(unit, x) (docs/your-model.md)");
      check_stage_passed_through();
    }
    throw;
  }
  check_stage_passed_through();
  return out;
}

void WrappedModule::check_stage_passed_through() const {
  // Note [Pipeline units of your own model]: each unit a stage does not hold passes its input
  // through models::call().
  for (int u = 0; u < num_units() && !skipped_.empty(); ++u) {
    if (holds_unit(u)) continue;
    DTORCH_CHECK_T(ConfigError, ran_units_.count(pipeline_units_[u]), "pipeline unit ",
                   pipeline_units_[u],
                   " did not run through models::call(): a stage that does not hold it passes "
                   "its input through there, so forward runs each pipeline unit as x = "
                   "models::call(unit, x) (docs/your-model.md)");
  }
}

}  // namespace dtorch::models
