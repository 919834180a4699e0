// The process-wide hook table of Note [Module hooks].
#include "dtorch/models/module_hooks.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "dtorch/core/error.h"

namespace dtorch::models {
namespace {

struct HookEntry {
  std::weak_ptr<const torch::nn::Module> owner;  // tells a live module from a new one at the
                                                 // address of a destroyed one
  std::shared_ptr<const ModuleHooks> hooks;
};

struct HookTable {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, HookEntry> entries;
  std::atomic<size_t> size{0};  // lets call() skip the lock when no hooks exist at all
};

HookTable& hook_table() {
  static HookTable t;
  return t;
}

}  // namespace

void set_module_hooks(torch::nn::Module& module, ModuleHooks hooks) {
  std::weak_ptr<const torch::nn::Module> owner;
  try {
    owner = module.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    DTORCH_FAIL(ConfigError,
                "set_module_hooks: the module is not owned by a shared_ptr; hooks "
                "go on registered submodules");
  }
  HookTable& t = hook_table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.entries[&module] = {owner, std::make_shared<const ModuleHooks>(std::move(hooks))};
  t.size = t.entries.size();
}

void clear_module_hooks(torch::nn::Module& module) {
  HookTable& t = hook_table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.entries.erase(&module);
  t.size = t.entries.size();
}

void edit_module_hooks(torch::nn::Module& module, const std::function<void(ModuleHooks&)>& edit) {
  auto existing = module_hooks(module);
  ModuleHooks hooks = existing ? *existing : ModuleHooks{};
  edit(hooks);
  if (hooks.pre || hooks.forward || hooks.post || hooks.around)
    set_module_hooks(module, std::move(hooks));
  else
    clear_module_hooks(module);
}

std::shared_ptr<const ModuleHooks> module_hooks(const torch::nn::Module& module) {
  HookTable& t = hook_table();
  if (t.size.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.entries.find(&module);
  if (it == t.entries.end()) return nullptr;
  auto live = it->second.owner.lock();
  if (!live || live.get() != &module) {
    t.entries.erase(it);
    t.size = t.entries.size();
    return nullptr;
  }
  return it->second.hooks;
}

}  // namespace dtorch::models
