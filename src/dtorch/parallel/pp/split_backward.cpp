// Note [Split backward]: input gradient first, weight gradients from the recorded gradients
// of the weight nodes later.
#include "dtorch/parallel/pp/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include <map>
#include <set>
#include <unordered_map>

#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"

namespace dtorch::pp {
namespace autograd = torch::autograd;

namespace {

/// Records the gradients flowing into a node (what the engine passes to its apply).
struct RecordGradients : autograd::FunctionPreHook {
  explicit RecordGradients(std::shared_ptr<autograd::variable_list> slot) : slot(std::move(slot)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    *slot = grads;
    return grads;
  }
  std::shared_ptr<autograd::variable_list> slot;
};

/// Single-edge nodes (transpose, expand, view of a parameter) tolerated between a weight
/// node and the parameter's accumulator.
constexpr int kMaxChain = 4;

}  // namespace

struct SplitBackward::State {
  struct WeightNode {
    compat::NodeHandle node;
    std::shared_ptr<autograd::variable_list> grads;
    std::vector<at::Tensor> params;
  };
  std::vector<WeightNode> nodes;
  /// Parameters W reaches from the root: unreachable by B, or behind several weight nodes.
  std::vector<at::Tensor> from_root;
  at::Tensor root, grad;
  bool done = false;
};

SplitBackward::SplitBackward() : s_(std::make_unique<State>()) {}
SplitBackward::~SplitBackward() = default;
SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;

std::pair<SplitBackward, at::Tensor> SplitBackward::input_gradient(
    const at::Tensor& root, const at::Tensor& grad, const at::Tensor& input,
    const std::vector<at::Tensor>& params) {
  SplitBackward sb;
  State& s = *sb.s_;
  s.root = root;
  s.grad = grad;
  std::unordered_map<autograd::Node*, size_t> accumulator_of;  // -> index in params
  for (size_t i = 0; i < params.size(); ++i) {
    if (auto acc = autograd::impl::try_get_grad_accumulator(params[i]))
      accumulator_of[acc.get()] = i;
  }
  auto param_behind = [&](autograd::Node* n) -> long {
    for (int depth = 0; n && depth <= kMaxChain; ++depth) {
      auto it = accumulator_of.find(n);
      if (it != accumulator_of.end()) return static_cast<long>(it->second);
      if (n->next_edges().size() != 1) return -1;
      n = n->next_edge(0).function.get();
    }
    return -1;
  };
  // Walk the graph once: weight nodes, and how many of them each parameter hangs off.
  std::map<autograd::Node*, size_t> node_index;
  std::vector<int> uses(params.size(), 0);
  std::set<autograd::Node*> seen;
  std::vector<compat::NodeHandle> stack;
  if (root.grad_fn()) stack.push_back(root.grad_fn());
  while (!stack.empty()) {
    compat::NodeHandle n = stack.back();
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    for (const autograd::Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      const long p = param_behind(e.function.get());
      if (p < 0) {
        stack.push_back(e.function);
        continue;
      }
      auto [it, added] = node_index.emplace(n.get(), s.nodes.size());
      if (added) s.nodes.push_back({n, std::make_shared<autograd::variable_list>(), {}});
      s.nodes[it->second].params.push_back(params[p]);
      ++uses[p];
    }
  }
  std::set<const at::TensorImpl*> shared;
  for (size_t i = 0; i < params.size(); ++i) {
    if (uses[i] > 1) {
      shared.insert(params[i].unsafeGetTensorImpl());
      s.from_root.push_back(params[i]);
    }
  }
  for (auto& w : s.nodes) {
    std::vector<at::Tensor> own;
    for (auto& p : w.params)
      if (!shared.count(p.unsafeGetTensorImpl())) own.push_back(p);
    w.params = std::move(own);
    w.node->add_pre_hook(std::make_unique<RecordGradients>(w.grads));
  }
  at::Tensor input_grad;
  if (input.defined() && input.requires_grad()) {
    autograd::variable_list seed;
    if (grad.defined()) seed.push_back(grad);
    input_grad = autograd::grad({root}, {input}, seed, /*retain_graph=*/true,
                                /*create_graph=*/false, /*allow_unused=*/true)[0];
  }
  // Weight nodes B did not run (not on the way to the input) give their parameters from the
  // root.
  std::vector<State::WeightNode> ran;
  for (auto& w : s.nodes) {
    if (w.grads->empty()) {
      s.from_root.insert(s.from_root.end(), w.params.begin(), w.params.end());
    } else {
      ran.push_back(std::move(w));
    }
  }
  s.nodes = std::move(ran);
  return {std::move(sb), input_grad};
}

void SplitBackward::weights() {
  State& s = *s_;
  DTORCH_CHECK(!s.done, "SplitBackward::weights runs once per micro-batch");
  s.done = true;
  // From the root first: that walk may pass through weight nodes, whose saved tensors the
  // per-node runs below release.
  if (!s.from_root.empty()) {
    autograd::variable_list seed;
    if (s.grad.defined()) seed.push_back(s.grad);
    autograd::backward({s.root}, seed, /*retain_graph=*/true, /*create_graph=*/false, s.from_root);
  }
  auto& engine = autograd::Engine::get_default_engine();
  for (auto& w : s.nodes) {
    if (w.params.empty()) continue;
    autograd::edge_list roots, outputs;
    autograd::variable_list grads;
    for (size_t i = 0; i < w.grads->size(); ++i) {
      if (!(*w.grads)[i].defined()) continue;
      roots.emplace_back(w.node, static_cast<uint32_t>(i));
      grads.push_back((*w.grads)[i]);
    }
    for (const auto& p : w.params)
      outputs.push_back(autograd::impl::gradient_edge(p));
    if (!roots.empty())
      engine.execute(roots, grads, /*keep_graph=*/true, /*create_graph=*/false,
                     /*accumulate_grad=*/true, outputs);
  }
  s = State();
  s.done = true;
}

}  // namespace dtorch::pp
