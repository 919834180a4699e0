// DeepSpeed's batch rule against the numbers DeepSpeed's engine computes and refuses, and under
// the names `dtorch train --global-batch-size` gives it.
#include "dtorch/train/config/batch_sizes.h"

#include <gtest/gtest.h>

#include <string>

#include "dtorch/core/error.h"

namespace dtorch::train {
namespace {

TEST(BatchSizes, TheRuleIsDeepSpeeds) {
  using O = std::optional<int64_t>;
  auto eq = [](BatchSizes b, int64_t micro, int64_t accum) {
    return b.micro == micro && b.accum == accum;
  };
  EXPECT_TRUE(eq(resolve_batch_sizes(64, 8, O{}, 2), 8, 4)) << "accumulation from the rest";
  EXPECT_TRUE(eq(resolve_batch_sizes(64, O{}, 4, 2), 8, 4)) << "micro batch from the rest";
  EXPECT_TRUE(eq(resolve_batch_sizes(O{}, 8, 4, 2), 8, 4));
  EXPECT_TRUE(eq(resolve_batch_sizes(64, O{}, O{}, 4), 16, 1));
  EXPECT_TRUE(eq(resolve_batch_sizes(O{}, 8, O{}, 4), 8, 1));
  EXPECT_TRUE(eq(resolve_batch_sizes(64, 8, 4, 2), 8, 4));
  auto error = [](O t, O m, O a, int dp) {
    try {
      resolve_batch_sizes(t, m, a, dp);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(64, 8, 2, 2)
                .find("train_batch_size 64 is not train_micro_batch_size_per_gpu 8 "
                      "x gradient_accumulation_steps 2 x data-parallel size 2 (= "
                      "32)"),
            std::string::npos);
  EXPECT_NE(error(100, 8, O{}, 2).find("(= 96)"), std::string::npos)
      << "integer division, then DeepSpeed's check";
  EXPECT_NE(error(4, 8, O{}, 2).find("is too small"), std::string::npos);
  EXPECT_NE(error(O{}, O{}, 2, 2).find("give train_batch_size or"), std::string::npos);
  // dtorch train --global-batch-size: the same rule, named by the flags.
  EXPECT_TRUE(eq(resolve_batch_sizes(192, O{}, O{}, 3), 64, 1));
  EXPECT_TRUE(eq(resolve_batch_sizes(192, O{}, O{}, 2), 96, 1));
  try {
    resolve_batch_sizes(100, O{}, O{}, 3, {"--global-batch-size", "--batch-size", "--accum-steps"});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch-size 100 is not --batch-size 33 x "
                                         "--accum-steps 1 x data-parallel size 3 (= 99)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("make --global-batch-size a multiple of 3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtorch::train
