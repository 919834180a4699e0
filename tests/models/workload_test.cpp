// Each model's account of its own workload (Model::workload): a transformer's units as the
// registry counts them by building each, its shape as its config and its tokens as its input
// give them, the same whichever units the instance holds; the other models report none.
#include "dtorch/models/workload.h"

#include <gtest/gtest.h>

#include "dtorch/models/registry.h"

namespace dtorch::models {
namespace {

TEST(ModelWorkload, TransformersReportTheUnitsTheRegistryCounts) {
  for (const char* name : {"gpt-debug", "gpt-long", "gpt-small", "vit-debug", "vit-tiny"}) {
    const Workload w = make_model(name, {0, 1})->workload();
    ASSERT_TRUE(w.transformer()) << name;
    const std::vector<UnitSize> units = model_units(name);
    ASSERT_EQ(w.unit_parameters.size(), units.size()) << name;
    for (size_t i = 0; i < units.size(); ++i)
      EXPECT_EQ(w.unit_parameters[i], units[i].parameters) << name << " " << units[i].name;
    EXPECT_EQ(w.layers + 2, static_cast<int64_t>(units.size())) << name;
    EXPECT_EQ(w.hidden % w.heads, 0) << name;
    EXPECT_GT(w.split_activations, 0) << name;
    EXPECT_EQ(w.whole_activations, 4) << name;
    // A stage holding one block reports the whole model's.
    const Workload stage = make_model(name, {1, 2})->workload();
    EXPECT_EQ(stage.unit_parameters, w.unit_parameters) << name;
    EXPECT_EQ(stage.tokens, w.tokens) << name;
  }
}

TEST(ModelWorkload, GptsAndVitsTokensAndHeads) {
  const auto gpt = make_model("gpt-debug");
  const Workload g = gpt->workload();
  EXPECT_TRUE(g.language());
  EXPECT_EQ(g.tokens, gpt->max_sequence_length());
  EXPECT_EQ(g.vocab, 256);
  EXPECT_EQ(g.heads, 4);
  EXPECT_EQ(g.mlp, 4 * g.hidden);
  EXPECT_EQ(g.classes, 0);
  EXPECT_EQ(g.patch_flops, 0);
  // vit-debug: 28 x 28 in 7 x 7 patches of one channel, 32 wide, and its class token.
  const Workload v = make_model("vit-debug")->workload();
  EXPECT_FALSE(v.language());
  EXPECT_EQ(v.tokens, 16 + 1);
  EXPECT_EQ(v.classes, 10);
  EXPECT_EQ(v.heads, 2);
  EXPECT_DOUBLE_EQ(v.patch_flops, 2.0 * 16 * 32 * 49);
  EXPECT_DOUBLE_EQ(v.split_activations, 4 + 2.0 * 64 / 32);
  EXPECT_EQ(make_model("vit-tiny")->workload().tokens, 49 + 1);
}

TEST(ModelWorkload, OtherModelsReportNone) {
  for (const char* name : {"mnist-cnn", "mnist-mlp", "resnet-debug"}) {
    const Workload w = make_model(name)->workload();
    EXPECT_FALSE(w.transformer()) << name;
    EXPECT_TRUE(w.unit_parameters.empty()) << name;
  }
}

}  // namespace
}  // namespace dtorch::models
