// Test binary entry point: either a worker process of a multi-rank test, or gtest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/workers.h"

int main(int argc, char** argv) {
  int rc = dtorch::testing::maybe_run_worker(argc, argv);
  if (rc >= 0) return rc;
  torch::set_num_threads(1);  // ctest runs tests side by side on few cores
  dtorch::testing::start_rank_server();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
