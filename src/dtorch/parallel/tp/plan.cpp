// Plan matching, and a model's plan completed for pipeline stages and sequence parallelism.
#include "dtorch/parallel/tp/plan.h"

#include "dtorch/core/error.h"
#include "dtorch/models/stage_union.h"

namespace dtorch::tp {

std::string to_string(Style s) {
  switch (s) {
    case Style::Colwise:
      return "colwise";
    case Style::Rowwise:
      return "rowwise";
    case Style::VocabEmbedding:
      return "vocab-embedding";
    case Style::EnterVocabRegion:
      return "enter-vocab-region";
    case Style::SequenceScatter:
      return "sequence-scatter";
    case Style::SequenceGather:
      return "sequence-gather";
  }
  return "?";
}

namespace {

// Sequence parallelism runs the blocks on slices of the sequence: cut before the first,
// gathered after the last.
void add_sequence_boundaries(Plan& plan, const models::Model& m) {
  auto blocks = m.block_names();
  if (blocks.empty()) return;  // a pipeline stage without blocks
  plan.push_back({blocks.front(), Style::SequenceScatter});
  plan.push_back({blocks.back(), Style::SequenceGather});
}

// A pipeline stage (Note [Pipeline units]) keeps the rules for the modules it holds.
Plan for_stage(Plan plan, const models::Model& m) {
  if (m.whole()) return plan;
  Plan kept;
  for (auto& rule : plan) {
    for (const auto& kv : m.named_modules("", /*include_self=*/false)) {
      if (models::module_path_matches(rule.module, kv.key())) {
        kept.push_back(rule);
        break;
      }
    }
  }
  return kept;
}

}  // namespace

Plan plan_for(const models::Model& model, int tp) {
  if (auto* u = dynamic_cast<const models::StageUnion*>(&model)) {
    // Note [Stage union]: every stage's rules (paths are the whole model's in both).
    Plan plan;
    for (const auto& stage : u->stages()) {
      for (const Rule& rule : plan_for(*stage, tp)) {
        bool known = false;
        for (const Rule& r : plan)
          known = known || (r.module == rule.module && r.style == rule.style);
        if (!known) plan.push_back(rule);
      }
    }
    return plan;
  }
  Plan plan = model.tensor_parallel_plan(tp);
  add_sequence_boundaries(plan, model);
  return for_stage(plan, model);
}

}  // namespace dtorch::tp
