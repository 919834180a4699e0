// Test binary entry point: either a worker process of a multi-rank test, or gtest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "support/workers.h"

int main(int argc, char** argv) {
  int rc = dtorch::testing::maybe_run_worker(argc, argv);
  if (rc >= 0) return rc;
  torch::set_num_threads(1);  // ctest runs tests side by side on few cores
  // Note [Forked workers]: the ranks of multi-rank tests, and of the command lines tests run
  // with --nproc-per-node, are forks rather than new processes (tests that need exec'd
  // workers start them through `dtorch launch`, which always exec's; DTORCH_FORK_WORKERS=0
  // exec's them all, and the command lines too: Note [Fork server]).
  ::setenv("DTORCH_FORK_WORKERS", "1", 0);
  dtorch::testing::start_rank_server();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
