// Collectives on CUDA tensors: through NCCL (DTORCH_BACKEND=auto) with one GPU per rank, chosen by
// LOCAL_RANK as a GPU user's program does; through host memory and Gloo (DTORCH_BACKEND=gloo)
// with ranks sharing a GPU (Note [CUDA tensors over Gloo]). Skipped where dtorch has no CUDA,
// no NCCL or too few GPUs.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

DTORCH_TEST_WORKER(comm_cuda_collectives) {
  auto c = Communicator::from_env();
  const int r = c->rank(), n = c->size();
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, c->info().local_rank % gpus);
  auto s = torch::full({1000}, float(r + 1), on_gpu);
  c->allreduce(s, ReduceOp::Avg, "cuda avg");
  DTORCH_CHECK(s.cpu().equal(torch::full({1000}, (n + 1) / 2.0f)), "avg on CUDA is wrong");
  auto b = torch::full({7}, double(r), on_gpu.dtype(torch::kDouble));
  c->broadcast(b, n - 1, "cuda broadcast");
  DTORCH_CHECK(b.cpu().equal(torch::full({7}, double(n - 1), torch::kDouble)),
               "broadcast on CUDA is wrong");
  auto in = torch::arange(4 * n, on_gpu.dtype(torch::kFloat)) + r;
  auto out = torch::empty({4}, on_gpu);
  c->reduce_scatter(in, out, ReduceOp::Sum, "cuda reduce-scatter");
  auto want = torch::arange(4 * r, 4 * r + 4).to(torch::kFloat) * n + n * (n - 1) / 2;
  DTORCH_CHECK(out.cpu().equal(want), "reduce-scatter on CUDA is wrong");
  auto full = torch::empty({4 * n}, on_gpu);
  c->allgather_into(full, out, "cuda allgather");
  DTORCH_CHECK(full.narrow(0, 4 * r, 4).equal(out), "allgather on CUDA is wrong");
  auto got = torch::empty({4}, on_gpu);
  if (r == 0) c->send(out, 1, 3);
  if (r == 1) {
    c->recv(got, 0, 3);
    auto want0 = torch::arange(0, 4).to(torch::kFloat) * n + n * (n - 1) / 2;
    DTORCH_CHECK(got.cpu().equal(want0), "send/recv on CUDA is wrong");
  }
  std::vector<torch::Tensor> each(n, torch::empty({2}, on_gpu));
  for (auto& t : each)
    t = torch::empty({2}, on_gpu);
  c->allgather(each, torch::full({2}, float(r), on_gpu), "cuda allgather list");
  for (int k = 0; k < n; ++k)
    DTORCH_CHECK(each[k].cpu().equal(torch::full({2}, float(k))), "allgather list on CUDA");
}

TEST(Cuda, CollectivesOnOneGpuPerRankGoThroughNccl) {
  auto backends = compiled_backends();
  if (std::find(backends.begin(), backends.end(), "nccl") == backends.end())
    GTEST_SKIP() << "this dtorch has no NCCL (built against a CPU LibTorch)";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  EXPECT_EQ(testing::run_ranks(2, "comm_cuda_collectives"), 0);
}

TEST(Cuda, CollectivesOfRanksSharingOneGpuGoThroughHostMemory) {
  if (torch::cuda::device_count() < 1) GTEST_SKIP() << "needs a CUDA device";
  ::setenv("DTORCH_BACKEND", "gloo", 1);  // the ranks inherit it
  const int code = testing::run_ranks(2, "comm_cuda_collectives");
  ::unsetenv("DTORCH_BACKEND");
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace dtorch::comm
