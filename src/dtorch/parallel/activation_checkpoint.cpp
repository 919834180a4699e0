// Checkpointed blocks: forward without a graph, recomputation in backward (Note [Activation
// checkpointing]).
#include "dtorch/parallel/activation_checkpoint.h"

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <mutex>
#include <optional>

#include "dtorch/core/error.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/parallel/autocast.h"

namespace dtorch::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local bool taking_gradients = false;

// What backward needs to run a block's forward again exactly as it ran.
struct Recompute : torch::CustomClassHolder {
  std::function<at::Tensor(at::Tensor)> f;
  std::shared_ptr<torch::nn::Module> block;
  std::vector<at::Tensor> params;
  at::Device device = at::kCPU;
  at::Tensor rng_state;   // of device's default generator when the forward began
  AutocastMode autocast;  // the device's autocast when the forward began
};

struct CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::TensorList params,
                            c10::intrusive_ptr<Recompute> r) {
    ctx->save_for_backward({x});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(r);
    return r->f(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto holder = ctx->saved_data["recompute"].toCapsule();
    auto* r = static_cast<Recompute*>(holder.get());
    variable_list out(r->params.size() + 2);  // x, each parameter, the Recompute argument

    torch::AutoGradMode with_graph(true);
    at::Tensor input = x.detach();
    if (input.is_floating_point()) input.requires_grad_(true);
    // Buffers the recomputation moves (BatchNorm's statistics) go back to where the forward
    // left them once the gradients are taken (its backward reads them at their new version).
    std::vector<at::Tensor> buffers, kept;
    for (const auto& b : r->block->buffers()) {
      buffers.push_back(b);
      kept.push_back(b.clone());
    }
    struct PutBack {
      std::vector<at::Tensor>&buffers, &kept;
      ~PutBack() {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < buffers.size(); ++i)
          buffers[i].copy_(kept[i]);
      }
    } put_back{buffers, kept};
    at::Tensor y;
    {
      // The same random numbers (dropout) and autocast as the forward; the generator's lock
      // is held only to swap its state (the forward draws under it).
      at::Generator gen = at::globalContext().defaultGenerator(r->device);
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        now = gen.get_state();
        gen.set_state(r->rng_state);
      }
      struct Restore {
        at::Generator& gen;
        const at::Tensor& state;
        ~Restore() {
          std::lock_guard<std::mutex> lock(gen.mutex());
          gen.set_state(state);
        }
      } restore{gen, now};
      Autocast same(r->autocast, /*exact=*/true);
      y = r->f(input);
    }
    if (!y.requires_grad()) return out;
    // Only the gradients this backward asks for: a zero-bubble schedule's input-gradient pass
    // wants the input's alone, its weight pass the parameters' (Note [Split backward]).
    std::vector<at::Tensor> wrt;
    std::vector<size_t> slot;
    if (input.requires_grad() && ctx->needs_input_grad(0)) wrt.push_back(input), slot.push_back(0);
    for (size_t i = 0; i < r->params.size(); ++i) {
      if (r->params[i].requires_grad() && ctx->needs_input_grad(i + 1))
        wrt.push_back(r->params[i]), slot.push_back(i + 1);
    }
    if (wrt.empty()) return out;
    struct Taking {
      bool outer = taking_gradients;
      Taking() { taking_gradients = true; }
      ~Taking() { taking_gradients = outer; }
    } taking;
    variable_list g = torch::autograd::grad({y}, wrt, {grads[0]}, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k)
      out[slot[k]] = g[k];
    return out;
  }
};

at::Tensor run_checkpointed(const std::shared_ptr<torch::nn::Module>& block, at::Tensor x,
                            std::function<at::Tensor(at::Tensor)> f) {
  // Without a graph to record (evaluation, no_grad) there is nothing to save.
  if (!torch::GradMode::is_enabled()) return f(std::move(x));
  auto r = c10::make_intrusive<Recompute>();
  r->f = std::move(f);
  r->block = block;
  r->params = block->parameters();
  r->device = x.device();
  {
    at::Generator gen = at::globalContext().defaultGenerator(r->device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    r->rng_state = gen.get_state();
  }
  r->autocast = current_autocast(r->device.type());
  const std::vector<at::Tensor> params = r->params;
  return CheckpointedBlock::apply(x, at::TensorList(params), r);
}

void install(models::Model& model, int every) {
  if (every == 0) {
    model.set_block_runner({});
    return;
  }
  const std::vector<std::string> names = model.block_names();
  DTORCH_CHECK_T(ConfigError, !names.empty(),
                 "activation checkpointing: the model names no blocks (Model::block_names()); "
                 "list its repeating blocks and run each through run_block");
  std::map<std::string, std::shared_ptr<torch::nn::Module>> chosen;
  auto modules = model.named_modules("", /*include_self=*/false);
  for (size_t i = 0; i < names.size(); i += every) {
    DTORCH_CHECK_T(ConfigError, modules.contains(names[i]), "activation checkpointing: block ",
                   names[i], " is not a submodule of the model");
    chosen[names[i]] = modules[names[i]];
  }
  model.set_block_runner(
      [chosen](const std::string& block, at::Tensor x, std::function<at::Tensor(at::Tensor)> f) {
        auto it = chosen.find(block);
        if (it == chosen.end()) return f(std::move(x));
        return run_checkpointed(it->second, std::move(x), std::move(f));
      });
}

}  // namespace

void checkpoint_activations(models::Model& model, ActivationCheckpointing opts) {
  DTORCH_CHECK_T(ConfigError, opts.every >= 0, "--activation-checkpointing ", opts.every,
                 ": give K >= 1 to checkpoint every K-th block (1: every block)");
  if (auto* stages = dynamic_cast<models::StageUnion*>(&model)) {
    // A stage may hold no block (the embedding or the head alone): it recomputes nothing.
    for (const auto& s : stages->stages())
      if (!s->block_names().empty()) install(*s, opts.every);
    return;
  }
  install(model, opts.every);
}

bool taking_block_gradients() {
  return taking_gradients;
}

}  // namespace dtorch::parallel
