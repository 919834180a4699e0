// Note [Stage union]: a rank's interleaved stages seen as one module hold exactly the stages'
// tensors under the whole model's names, and refuse stages that share a parameter.
#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/parallel/pp/stage_plan.h"

namespace dtorch::models {
namespace {

pp::StagePlan four_stages(const std::string& name) {
  std::vector<int64_t> counts;
  for (const auto& u : model_units(name))
    counts.push_back(u.parameters);
  return pp::balance_stages(counts, 4);
}

TEST(StageUnion, HoldsTheStagesOwnTensorsUnderTheWholeModelsNames) {
  for (const std::string name : {"gpt-debug", "resnet-debug", "vit-debug"}) {
    auto plan = four_stages(name);
    // Rank 0 of pp 2 under an interleaved schedule: stages 0 and 2.
    auto first = make_model(name, plan.stages[0]), third = make_model(name, plan.stages[2]);
    StageUnion both({first, third});
    auto params = both.named_parameters();
    auto buffers = both.named_buffers();
    size_t expected_params = 0, expected_buffers = 0;
    for (const auto& stage : {first, third}) {
      for (const auto& kv : stage->named_parameters()) {
        ++expected_params;
        ASSERT_NE(params.find(kv.key()), nullptr) << name << " " << kv.key();
        EXPECT_TRUE(params[kv.key()].is_same(kv.value())) << name << " " << kv.key();
      }
      for (const auto& kv : stage->named_buffers()) {
        ++expected_buffers;
        ASSERT_NE(buffers.find(kv.key()), nullptr) << name << " " << kv.key();
        EXPECT_TRUE(buffers[kv.key()].is_same(kv.value())) << name << " " << kv.key();
      }
    }
    EXPECT_EQ(params.size(), expected_params) << name;
    EXPECT_EQ(buffers.size(), expected_buffers) << name;
    EXPECT_EQ(both.units().begin, plan.stages[0].begin) << name;
    EXPECT_EQ(both.units().end, plan.stages[2].end) << name;
    EXPECT_EQ(both.takes_tokens(), first->takes_tokens()) << name;
    // Training mode reaches the stages' modules.
    both.eval();
    EXPECT_FALSE(first->is_training()) << name;
    EXPECT_THROW(both.forward(torch::zeros({1})), ConfigError) << name;
  }
}

TEST(StageUnion, StagesSharingAParameterAreRefused) {
  // A GPT's first and last stage both hold the tied token embedding.
  auto plan = four_stages("gpt-debug");
  auto first = make_model("gpt-debug", plan.stages[0]),
       last = make_model("gpt-debug", plan.stages[3]);
  try {
    StageUnion both({first, last});
    FAIL() << "stages sharing transformer.wte.weight were merged";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(StageUnion({}), ConfigError);
}

}  // namespace
}  // namespace dtorch::models
