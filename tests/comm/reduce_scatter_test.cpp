// Reduce-scatter and flat allgather, on every path (shared memory, dtorch's Gloo ring, and
// Gloo's own collectives on LibTorch 2.x, Note [Gloo on 2.x]):
// each rank's result equals the slice of a sum computed locally in float64, and the traffic
// counters report the volume of a real reduce-scatter, not of an allreduce.
#include <gtest/gtest.h>

#include <fstream>

#include "dtorch/comm/backend_compat.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

// What rank r contributes: distinct per rank and element, known to every rank.
torch::Tensor contribution(int r, int64_t numel, torch::Dtype dtype) {
  return (torch::arange(numel, torch::kDouble) * 0.001 + r * 1.5).sin().to(dtype);
}

// args: DIR PATH (shm|gloo|native) NUMEL DTYPE (float|double|bf16)
DTORCH_TEST_WORKER(comm_reduce_scatter) {
  setenv("DTORCH_SHM", args.at(1) == "shm" ? "1" : "0", 1);
  setenv("DTORCH_GLOO_COLLECTIVES", args.at(1) == "native" ? "native" : "dtorch", 1);
  auto c = Communicator::from_env();
  const int r = c->rank(), n = c->size();
  const int64_t shard = std::stoll(args.at(2));
  const auto dtype = args.at(3) == "double" ? torch::kDouble
                     : args.at(3) == "bf16" ? torch::kBFloat16
                                            : torch::kFloat;
  torch::Tensor expected = torch::zeros({shard * n}, torch::kDouble);
  for (int q = 0; q < n; ++q)
    expected += contribution(q, shard * n, dtype).to(torch::kDouble);
  expected = expected.narrow(0, r * shard, shard);

  // Sum into a separate output, then Avg into the rank's own chunk of the input.
  auto in = contribution(r, shard * n, dtype);
  auto out = torch::empty({shard}, dtype);
  c->reset_traffic();
  c->reduce_scatter(in, out, ReduceOp::Sum, "test");
  const double tol = dtype == torch::kBFloat16 ? 0.05 : dtype == torch::kFloat ? 1e-5 : 1e-12;
  double err = (out.to(torch::kDouble) - expected).abs().max().item<double>();
  DTORCH_CHECK(err <= tol, "reduce_scatter sum off by ", err);
  // bf16 travels as float on Gloo 1.13, as itself on 2.x.
  const int64_t esize = dtype == torch::kDouble                             ? 8
                        : dtype == torch::kBFloat16 && kGlooReducesBFloat16 ? 2
                                                                            : 4;
  DTORCH_CHECK(c->traffic().reduce_scatter == (n - 1) * shard * esize, "reduce_scatter traffic ",
               c->traffic().reduce_scatter);
  DTORCH_CHECK(c->traffic().allreduce == 0, "reduce_scatter counted as allreduce");

  auto in2 = contribution(r, shard * n, dtype);
  auto own = in2.narrow(0, r * shard, shard);
  auto w = c->reduce_scatter_async(in2, own, ReduceOp::Avg, "test avg");
  w.wait();
  err = (own.to(torch::kDouble) - expected / n).abs().max().item<double>();
  DTORCH_CHECK(err <= tol, "reduce_scatter avg into own chunk off by ", err);

  // Allgather of each rank's shard into a flat buffer, input aliasing its own chunk.
  auto full = torch::zeros({shard * n}, dtype);
  full.narrow(0, r * shard, shard).copy_(contribution(r, shard, dtype));
  c->allgather_into(full, full.narrow(0, r * shard, shard), "test gather");
  for (int q = 0; q < n; ++q) {
    DTORCH_CHECK(full.narrow(0, q * shard, shard).equal(contribution(q, shard, dtype)),
                 "allgather chunk ", q, " differs");
  }
  const int64_t gsize = dtype == torch::kDouble ? 8 : dtype == torch::kBFloat16 ? 2 : 4;
  DTORCH_CHECK(c->traffic().allgather == (n - 1) * shard * gsize, "allgather traffic ",
               c->traffic().allgather);
}

// Bytes this process has written through write/send system calls (sockets included).
int64_t bytes_written() {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "wchar:") return value;
  }
  return -1;
}

// args: DIR. Over Gloo (TCP), measures what reduce-scatter, allgather and allreduce of the
// same 4 MiB buffer really write to the sockets, and writes it to DIR/wire<rank>.
DTORCH_TEST_WORKER(comm_wire_bytes) {
  setenv("DTORCH_SHM", "0", 1);
  auto c = Communicator::from_env();
  const int n = c->size();
  const int64_t numel = 1 << 20;  // 4 MiB of float
  auto measure = [&](auto op) {
    op();  // warm-up: connections and buffers set up
    c->barrier();
    int64_t before = bytes_written();
    for (int i = 0; i < 5; ++i)
      op();
    int64_t sent = bytes_written() - before;
    c->barrier();
    return sent / 5;
  };
  auto in = torch::ones({numel});
  auto out = torch::empty({numel / n});
  int64_t rs = measure([&] { c->reduce_scatter(in, out); });
  int64_t ag = measure([&] { c->allgather_into(in, out); });
  int64_t ar = measure([&] { c->allreduce(in); });
  std::ofstream(str(args.at(0), "/wire", c->rank())) << rs << " " << ag << " " << ar;
}

TEST(ReduceScatterWire, SendsWhatARealReduceScatterSends) {
  auto dir = testing::scratch_dir("wire_bytes");
  ASSERT_EQ(testing::run_ranks(4, "comm_wire_bytes", {dir}), 0);
  const double buffer = 4 << 20, n = 4;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(str(dir, "/wire", r));
    double rs = 0, ag = 0, ar = 0;
    in >> rs >> ag >> ar;
    // (N-1)/N of the buffer (plus a few headers), and half of what an allreduce sends.
    EXPECT_NEAR(rs / ((n - 1) / n * buffer), 1.0, 0.05) << "rank " << r;
    EXPECT_NEAR(ag / ((n - 1) / n * buffer), 1.0, 0.05) << "rank " << r;
    EXPECT_NEAR(ar / (2 * (n - 1) / n * buffer), 1.0, 0.05) << "rank " << r;
  }
}

struct Case {
  int ranks;
  const char* path;
  int64_t shard;
  const char* dtype;
};

class ReduceScatter : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceScatter, MatchesSliceOfFloat64Sum) {
  auto p = GetParam();
  if (std::string(p.path) == "native" && !kGlooHasReduceScatter)
    GTEST_SKIP() << "Gloo in LibTorch " << TORCH_VERSION << " has no reduce-scatter";
  auto dir = testing::scratch_dir("reduce_scatter");
  EXPECT_EQ(testing::run_ranks(p.ranks, "comm_reduce_scatter",
                               {dir, p.path, std::to_string(p.shard), p.dtype}),
            0);
}

// Large shards cross the shared-memory slot size (4 MiB) so chunking is exercised.
INSTANTIATE_TEST_SUITE_P(
    Paths, ReduceScatter,
    ::testing::Values(Case{2, "shm", 1000, "float"}, Case{3, "shm", 700001, "float"},
                      Case{2, "shm", 333, "double"}, Case{2, "gloo", 1000, "float"},
                      Case{3, "gloo", 200003, "float"}, Case{4, "gloo", 17, "double"},
                      Case{2, "gloo", 64, "bf16"}, Case{2, "shm", 64, "bf16"},
                      Case{2, "native", 1000, "float"}, Case{3, "native", 200003, "float"},
                      Case{4, "native", 17, "double"}, Case{2, "native", 64, "bf16"}),
    [](const auto& info) {
      return std::string(info.param.path) + std::to_string(info.param.ranks) + "r" +
             std::to_string(info.param.shard) + info.param.dtype;
    });

}  // namespace
}  // namespace dtorch::comm
