// Point-to-point: isend/irecv return handles that overlap with other work, and messages between
// some ranks never desynchronise the collectives all ranks run afterwards (the Gloo ring
// reduce-scatter derives its message tags from the collective sequence, Note [Reduce-scatter on
// Gloo], so point-to-point must not take numbers from it).
#include <gtest/gtest.h>

#include <fstream>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

using testing::read_file;

// Three ranks over Gloo (no shared memory): rank 0 sends two messages to rank 1, rank 2 sends
// none; then every rank reduce-scatters through dtorch's ring.
DTORCH_TEST_WORKER(p2p_then_reduce_scatter) {
  setenv("DTORCH_SHM", "0", 1);
  setenv("DTORCH_GLOO_COLLECTIVES", "dtorch", 1);
  setenv("DTORCH_TIMEOUT", "15", 1);
  auto c = Communicator::from_env();
  const int r = c->rank(), n = c->size();
  if (r == 0) {
    c->send(torch::full({4}, 7.0), 1);
    c->send(torch::full({4}, 8.0), 1);
  } else if (r == 1) {
    auto a = torch::empty({4}), b = torch::empty({4});
    c->recv(a, 0);
    c->recv(b, 0);
    DTORCH_CHECK(a[0].item<double>() == 7 && b[0].item<double>() == 8, "wrong messages");
  }
  auto in = torch::arange(3 * n, torch::kFloat) + r;
  auto out = torch::empty({3});
  c->reduce_scatter(in, out, ReduceOp::Sum, "after point-to-point");
  // sum over q of (i + q) for i in rank r's chunk
  auto want = torch::arange(3 * r, 3 * r + 3, torch::kFloat) * n + n * (n - 1) / 2;
  DTORCH_CHECK(out.equal(want), "reduce_scatter after point-to-point gave ", out);
  std::ofstream(args.at(0) + "/rank" + std::to_string(r)) << "ok";
}

TEST(PointToPoint, SendsBetweenSomeRanksKeepCollectivesInStep) {
  std::string dir = testing::scratch_dir("p2p_then_rs");
  EXPECT_EQ(testing::run_ranks(3, "p2p_then_reduce_scatter", {dir}, 60), 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(read_file(dir + "/rank" + std::to_string(r)), "ok") << "rank " << r;
}

}  // namespace
}  // namespace dtorch::comm
