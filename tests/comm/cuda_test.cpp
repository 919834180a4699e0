// Collectives on CUDA tensors go through NCCL (DTORCH_BACKEND=auto): one GPU per rank, chosen by
// LOCAL_RANK as a GPU user's program does. Skipped where dtorch has no NCCL or too few GPUs.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

DTORCH_TEST_WORKER(comm_cuda_collectives) {
  auto c = Communicator::from_env();
  const int r = c->rank(), n = c->size();
  const auto on_gpu = torch::TensorOptions().device(torch::kCUDA, c->info().local_rank);
  auto s = torch::full({1000}, float(r + 1), on_gpu);
  c->allreduce(s, ReduceOp::Avg, "cuda avg");
  DTORCH_CHECK(s.cpu().equal(torch::full({1000}, (n + 1) / 2.0f)), "avg on CUDA is wrong");
  auto b = torch::full({7}, double(r), on_gpu.dtype(torch::kDouble));
  c->broadcast(b, n - 1, "cuda broadcast");
  DTORCH_CHECK(b.cpu().equal(torch::full({7}, double(n - 1), torch::kDouble)),
               "broadcast on CUDA is wrong");
  auto in = torch::arange(4 * n, on_gpu) + r;
  auto out = torch::empty({4}, on_gpu);
  c->reduce_scatter(in, out, ReduceOp::Sum, "cuda reduce-scatter");
  auto want = torch::arange(4 * r, 4 * r + 4).to(torch::kFloat) * n + n * (n - 1) / 2;
  DTORCH_CHECK(out.cpu().equal(want), "reduce-scatter on CUDA is wrong");
  auto full = torch::empty({4 * n}, on_gpu);
  c->allgather_into(full, out, "cuda allgather");
  DTORCH_CHECK(full.narrow(0, 4 * r, 4).equal(out), "allgather on CUDA is wrong");
}

TEST(Cuda, CollectivesOnOneGpuPerRankGoThroughNccl) {
  auto backends = compiled_backends();
  if (std::find(backends.begin(), backends.end(), "nccl") == backends.end())
    GTEST_SKIP() << "this dtorch has no NCCL (built against a CPU LibTorch)";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  EXPECT_EQ(testing::run_ranks(2, "comm_cuda_collectives"), 0);
}

}  // namespace
}  // namespace dtorch::comm
