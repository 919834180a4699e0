// `dtorch version` names the LibTorch it was built against and the backends it can create;
// a build against a CUDA LibTorch (PyPI's wheel) must have NCCL compiled in.
#include <gtest/gtest.h>
#include <torch/version.h>

#include "dtorch/comm/communicator.h"
#include "support/command.h"

namespace dtorch {
namespace {

using testing::contains;

TEST(VersionCli, NamesLibTorchAndBackends) {
  auto r = testing::run_command("version_cmd", {DTORCH_CLI, "version"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.out, std::string("LibTorch ") + TORCH_VERSION)) << r.out;
  auto backends = comm::compiled_backends();
  EXPECT_EQ(backends.at(0), "gloo");
#ifdef DTORCH_WITH_CUDA
  // A CUDA LibTorch without NCCL would leave GPU users with Gloo alone: fail the build's tests.
  EXPECT_EQ(backends, (std::vector<std::string>{"gloo", "nccl"}));
  EXPECT_TRUE(contains(r.out, "backends gloo, nccl")) << r.out;
#else
  EXPECT_EQ(backends, (std::vector<std::string>{"gloo"}));
#endif
}

}  // namespace
}  // namespace dtorch
