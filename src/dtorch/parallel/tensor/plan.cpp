// Plan matching and the built-in models' tensor-parallel plans.
#include "dtorch/parallel/tensor/plan.h"

#include "dtorch/core/error.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/models/vit.h"

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

bool matches(const std::string& pattern, const std::string& path) {
  size_t p = 0, q = 0;
  while (p <= pattern.size() && q <= path.size()) {
    size_t pe = pattern.find('.', p), qe = path.find('.', q);
    if (pe == std::string::npos) pe = pattern.size();
    if (qe == std::string::npos) qe = path.size();
    std::string a = pattern.substr(p, pe - p), b = path.substr(q, qe - q);
    if (a != "*" && a != b) return false;
    if (a == "*" && b.empty()) return false;
    const bool pattern_done = pe == pattern.size(), path_done = qe == path.size();
    if (pattern_done || path_done) return pattern_done && path_done;
    p = pe + 1;
    q = qe + 1;
  }
  return false;
}

namespace {

void check_divides(int tp, int64_t n, const std::string& what, const std::string& model) {
  DTORCH_CHECK_T(ConfigError, n % tp == 0, "tensor parallelism over ", tp, " ranks splits the ",
                 what, " of ", model, " (", n, ") ", tp, " ways: choose a tp that divides ", n);
}

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
      if (matches(rule.module, kv.key())) {
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
  if (auto* g = dynamic_cast<const models::GPT*>(&model)) {
    const auto& c = g->config();
    check_divides(tp, c.n_head, "attention heads", "this GPT");
    check_divides(tp, c.vocab_size, "vocabulary", "this GPT");
    Plan plan = {
        {"transformer.wte", Style::VocabEmbedding},
        {"transformer.h.*.attn.c_attn", Style::Colwise, 3},
        {"transformer.h.*.attn.c_proj", Style::Rowwise},
        {"transformer.h.*.mlp.c_fc", Style::Colwise},
        {"transformer.h.*.mlp.c_proj", Style::Rowwise},
        // Note [Tied embedding]: the head is wte, split by vocabulary; its input enters.
        {"transformer.ln_f", Style::EnterVocabRegion},
    };
    add_sequence_boundaries(plan, model);
    return for_stage(plan, model);
  }
  if (auto* v = dynamic_cast<const models::VisionTransformer*>(&model)) {
    const auto& c = v->config();
    check_divides(tp, c.num_heads, "attention heads", "this ViT");
    check_divides(tp, c.mlp_dim, "MLP width", "this ViT");
    Plan plan = {
        // in_proj_weight / in_proj_bias are the attention module's own parameters.
        {"encoder.layers.*.self_attention", Style::Colwise, 3},
        {"encoder.layers.*.self_attention.out_proj", Style::Rowwise},
        {"encoder.layers.*.mlp.0", Style::Colwise},
        {"encoder.layers.*.mlp.3", Style::Rowwise},
    };
    add_sequence_boundaries(plan, model);
    return for_stage(plan, model);
  }
  DTORCH_FAIL(ConfigError, "tensor parallelism has plans for the transformers (gpt-*, vit-*); ",
              "this model has none: train it with data parallelism (--tp 1) or ZeRO");
}

}  // namespace dtorch::tp
