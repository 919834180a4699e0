// Note [Deferred initialisation], the models' half: a model built without memory has every
// parameter's name, shape and dtype but no storage, leaves the generator as make_model does,
// and its units built again one at a time hold exactly the whole model's values. ZeRO-3's half
// (each rank's shards of those values) is tests/parallel/zero/deferred_init_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "dtorch/core/storage.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/unit_seeds.h"

namespace dtorch::models {
namespace {

class DeferredModel : public ::testing::TestWithParam<const char*> {};

TEST_P(DeferredModel, HasTheShapesButNoMemory) {
  torch::manual_seed(3);
  auto whole = make_model(GetParam());
  const at::Tensor whole_next = torch::randn({8});
  torch::manual_seed(3);
  auto deferred = make_deferred_model(GetParam());
  const at::Tensor deferred_next = torch::randn({8});
  EXPECT_TRUE(deferred->deferred());
  EXPECT_FALSE(whole->deferred());
  // Whatever the model draws next (dropout, data order) is what make_model leaves.
  EXPECT_TRUE(torch::equal(whole_next, deferred_next));

  auto expected = whole->named_parameters(), got = deferred->named_parameters();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].key(), expected[i].key());
    EXPECT_EQ(got[i].value().sizes(), expected[i].value().sizes()) << got[i].key();
    EXPECT_EQ(got[i].value().scalar_type(), expected[i].value().scalar_type()) << got[i].key();
    EXPECT_TRUE(got[i].value().requires_grad()) << got[i].key();
    EXPECT_FALSE(holds_storage(got[i].value())) << got[i].key() << " kept its memory";
  }
  for (const auto& b : deferred->named_buffers())  // buffers are small and stay
    EXPECT_TRUE(holds_storage(b.value())) << b.key();
}

TEST_P(DeferredModel, UnitsBuiltAgainHoldTheWholeModelsValues) {
  torch::manual_seed(3);
  auto whole = make_model(GetParam());
  std::map<std::string, at::Tensor> expected;
  for (const auto& kv : whole->named_parameters())
    expected[kv.key()] = kv.value();

  torch::manual_seed(3);
  auto deferred = make_deferred_model(GetParam());
  std::map<std::string, int> seen;
  {
    GeneratorStateGuard keep;
    set_cpu_generator_state(deferred->deferred_init().generator_state);
    deferred->deferred_init().for_each_unit([&](Model& unit) {
      for (const auto& kv : unit.named_parameters()) {
        ++seen[kv.key()];
        ASSERT_TRUE(expected.count(kv.key())) << kv.key();
        EXPECT_TRUE(torch::equal(kv.value(), expected[kv.key()])) << kv.key();
      }
    });
  }
  EXPECT_EQ(seen.size(), expected.size());
  // Building the units again leaves the generator where it was.
  const at::Tensor next = torch::randn({8});
  torch::manual_seed(3);
  make_model(GetParam());
  EXPECT_TRUE(torch::equal(next, torch::randn({8})));
}

INSTANTIATE_TEST_SUITE_P(Models, DeferredModel,
                         ::testing::Values("gpt-debug", "vit-debug", "resnet-debug", "mnist-cnn"),
                         [](const auto& info) {
                           std::string m = info.param;
                           for (auto& ch : m)
                             if (ch == '-') ch = '_';
                           return m;
                         });

}  // namespace
}  // namespace dtorch::models
