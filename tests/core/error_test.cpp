// Errors name their source line relative to the repository, never the build machine's path.
#include "dtorch/core/error.h"

#include <gtest/gtest.h>

#include "support/command.h"

namespace dtorch {
namespace {

TEST(ErrorLocation, IsRelativeToTheRepository) {
  EXPECT_EQ(detail::where("/home/u/src/dtorch/tools/cmd_launch.cpp", 73),
            "tools/cmd_launch.cpp:73");
  EXPECT_EQ(detail::where("/b/tools/dtorch/src/dtorch/train/trainer.cpp", 5),
            "src/dtorch/train/trainer.cpp:5");
  EXPECT_EQ(detail::where("/x/dtorch/tests/core/error_test.cpp", 1), "tests/core/error_test.cpp:1");
  EXPECT_EQ(detail::where("src/dtorch/core/error.cpp", 2), "src/dtorch/core/error.cpp:2");
  EXPECT_EQ(detail::where("elsewhere.cpp", 3), "elsewhere.cpp:3");
}

TEST(ErrorLocation, WarningsAndNestedMessagesLoseTheirLocations) {
  // A caught error's message inside a warning ("checkpoint X is unusable (...)") or another
  // error keeps its words and loses " [file:line]", wherever it stands.
  std::string inner;
  try {
    DTORCH_FAIL(CheckpointError, "metadata.json is malformed");
  } catch (const CheckpointError& e) {
    inner = e.what();
  }
  ASSERT_NE(inner.find(" [tests/core/error_test.cpp:"), std::string::npos) << inner;
  EXPECT_EQ(
      without_locations("checkpoint a is unusable (" + inner + "); using b [src/dtorch/x.cpp:9]"),
      "checkpoint a is unusable (metadata.json is malformed); using b");
  EXPECT_EQ(without_locations("a list [1, 2] stays"), "a list [1, 2] stays");
}

TEST(ErrorLocation, CliErrorsDoNotNameTheBuildMachinesPath) {
  auto r = testing::run_command("error_path", {DTORCH_CLI, "launch", "--no-such-flag", "x"}, 60);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "no-such-flag")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, DTORCH_SOURCE_DIR)) << r.err;
}

}  // namespace
}  // namespace dtorch
