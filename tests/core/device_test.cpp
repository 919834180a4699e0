// The device a rank trains on (Note [One GPU per rank]), decided from what the machine offers,
// and the device-side clock and batch copier as they behave on the CPU.
#include "dtorch/core/device.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "dtorch/core/error.h"
#include "support/error_of.h"

namespace dtorch {
namespace {

const CudaAvailability kNoCuda{false, 0};
const CudaAvailability kCudaNoGpu{true, 0};
const CudaAvailability kTwoGpus{true, 2};

TEST(DeviceChoice, CpuAndAutoWithoutAGpuAreTheCpu) {
  EXPECT_EQ(resolve_device(DeviceKind::CPU, 0, 1, kTwoGpus), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device(DeviceKind::Auto, 0, 1, kNoCuda), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device(DeviceKind::Auto, 3, 8, kCudaNoGpu), at::Device(at::kCPU));
}

TEST(DeviceChoice, EachLocalRankGetsItsOwnGpu) {
  EXPECT_EQ(resolve_device(DeviceKind::CUDA, 0, 2, kTwoGpus), at::Device(at::kCUDA, 0));
  EXPECT_EQ(resolve_device(DeviceKind::CUDA, 1, 2, kTwoGpus), at::Device(at::kCUDA, 1));
  EXPECT_EQ(resolve_device(DeviceKind::Auto, 1, 2, kTwoGpus), at::Device(at::kCUDA, 1));
}

TEST(DeviceChoice, MoreRanksThanGpusIsAnErrorNamingBothUnlessSharedOverGloo) {
  const std::string e =
      testing::error_of<ConfigError>([] { resolve_device(DeviceKind::CUDA, 2, 3, kTwoGpus); });
  EXPECT_NE(e.find("3 local ranks but 2 visible GPU(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e;
  EXPECT_NE(e.find("--nproc-per-node 2"), std::string::npos) << e;
  EXPECT_NE(e.find("DTORCH_BACKEND=gloo"), std::string::npos) << e;
  // Shared: rank r takes GPU r mod 2.
  EXPECT_EQ(resolve_device(DeviceKind::CUDA, 2, 3, kTwoGpus, /*share_gpus=*/true),
            at::Device(at::kCUDA, 0));
}

TEST(DeviceChoice, CudaWithoutCudaOrWithoutAGpuSaysHowToGetIt) {
  const std::string built =
      testing::error_of<ConfigError>([] { resolve_device(DeviceKind::CUDA, 0, 1, kNoCuda); });
  EXPECT_NE(built.find("without CUDA"), std::string::npos) << built;
  EXPECT_NE(built.find("TORCH=pip"), std::string::npos) << built;
  const std::string none =
      testing::error_of<ConfigError>([] { resolve_device(DeviceKind::CUDA, 0, 1, kCudaNoGpu); });
  EXPECT_NE(none.find("no GPU is visible"), std::string::npos) << none;
  EXPECT_NE(none.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << none;
}

TEST(DeviceChoice, ThisProcessSeesWhatItsLibTorchOffers) {
  const CudaAvailability here = cuda_availability();
#ifdef DTORCH_WITH_CUDA
  EXPECT_TRUE(here.compiled);
#else
  EXPECT_FALSE(here.compiled);
  EXPECT_EQ(here.visible, 0);
#endif
  EXPECT_EQ(device_memory(at::kCPU).peak_allocated, 0);
}

TEST(DeviceClock, OnTheCpuMarksAreTheHostClock) {
  DeviceClock clock(at::kCPU);
  const int64_t a = clock.mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t b = clock.mark();
  EXPECT_EQ(b, a + 1);
  EXPECT_GE(clock.seconds(a, b), 0.019);
  EXPECT_LT(clock.seconds(a, b), 5.0);
  clock.forget_before(b);
  EXPECT_THROW(clock.seconds(a, b), Error);
  EXPECT_EQ(clock.seconds(b, b), 0.0);
  EXPECT_EQ(clock.mark(), b + 1);  // numbers go on after forgetting
}

TEST(DeviceCopier, OnTheCpuHandsTheBatchBackAsItIs) {
  DeviceCopier copier(at::kCPU);
  auto x = torch::randn({3, 4}), y = torch::arange(3);
  copier.start({x, y});
  auto got = copier.ready();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].is_same(x));
  EXPECT_TRUE(got[1].is_same(y));
}

}  // namespace
}  // namespace dtorch
