// Note [Stage union]: merging the stages' module trees by path.
#include "dtorch/models/stage_union.h"

#include <map>

#include "dtorch/core/error.h"

namespace dtorch::models {
namespace {

// Registers into `into` what the modules `from` (one path of several stages) hold: their
// own parameters and buffers, and their children, shared when one of them has that child
// and merged into a fresh container when several do.
void merge(torch::nn::Module& into, const std::vector<torch::nn::Module*>& from,
           const std::string& path) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::shared_ptr<torch::nn::Module>>> children;
  for (torch::nn::Module* m : from) {
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      DTORCH_CHECK_T(ConfigError, !into.named_parameters(false).find(p.key()), "two pipeline ",
                     "stages on this rank hold parameter ", path, p.key(),
                     ": give each rank stages that share no parameter");
      into.register_parameter(p.key(), p.value(), p.value().requires_grad());
    }
    for (const auto& b : m->named_buffers(/*recurse=*/false)) {
      DTORCH_CHECK_T(ConfigError, !into.named_buffers(false).find(b.key()), "two pipeline ",
                     "stages on this rank hold buffer ", path, b.key());
      into.register_buffer(b.key(), b.value());
    }
    for (const auto& c : m->named_children()) {
      if (!children.count(c.key())) order.push_back(c.key());
      children[c.key()].push_back(c.value());
    }
  }
  for (const std::string& name : order) {
    const auto& list = children[name];
    if (list.size() == 1) {
      into.register_module(name, list.front());
      continue;
    }
    auto fresh = std::make_shared<torch::nn::Module>();
    std::vector<torch::nn::Module*> parts;
    for (const auto& c : list)
      parts.push_back(c.get());
    merge(*fresh, parts, path + name + ".");
    into.register_module(name, fresh);
  }
}

}  // namespace

StageUnion::StageUnion(std::vector<std::shared_ptr<Model>> stages) : stages_(std::move(stages)) {
  DTORCH_CHECK_T(ConfigError, !stages_.empty(), "a stage union needs at least one stage");
  // The units from the first stage's first to the last stage's last (those between, held by
  // other ranks, included: units() is a span here).
  set_units({stages_.front()->units().begin, stages_.back()->units().end});
  std::vector<torch::nn::Module*> roots;
  for (const auto& s : stages_)
    roots.push_back(s.get());
  merge(*this, roots, "");
}

std::vector<std::string> StageUnion::block_names() const {
  std::vector<std::string> names;
  for (const auto& s : stages_)
    for (auto& b : s->block_names())
      names.push_back(std::move(b));
  return names;
}

void StageUnion::train(bool on) {
  Model::train(on);
  for (const auto& s : stages_)
    s->train(on);
}

torch::Tensor StageUnion::forward(torch::Tensor) {
  DTORCH_FAIL(ConfigError, "a rank's several pipeline stages run one at a time through ",
              "pp::Pipeline, not as one forward");
  return {};
}

}  // namespace dtorch::models
