// `dtorch launch` runs a Python PyTorch program as torchrun would: init_process_group with
// env:// joins the store the launcher serves (TORCHELASTIC_USE_AGENT_STORE), on the PyTorch
// that matches the LibTorch under test. The other direction, PyTorch's torchrun starting
// `dtorch train`, is in tools/train_test.cpp.
#include <gtest/gtest.h>

#include <fstream>

#include "dtorch/core/torch_compat.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using testing::contains;

TEST(Torchrun, DtorchLaunchRunsAPyTorchProgramWithEnvRendezvous) {
  DTORCH_SKIP_WITHOUT_PYTHON(false);
  const std::string dir = testing::scratch_dir("torchrun_python_program");
  std::ofstream(dir + "/allreduce.py") << R"PY(
import os, sys, datetime
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
r, n = dist.get_rank(), dist.get_world_size()
assert r == int(os.environ["RANK"]) and n == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
store = dist.distributed_c10d._get_default_store()
store.set("seen/%d" % r, "yes")
dist.barrier()
print("rank %d of %d: sum %g, torch %s, local rank %s, agent store %s" % (
    r, n, t.item(), torch.__version__.split("+")[0], os.environ["LOCAL_RANK"],
    os.environ.get("TORCHELASTIC_USE_AGENT_STORE")))
dist.destroy_process_group()
)PY";
  auto r = testing::run_command("torchrun_python_program_cmd",
                                {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node", "2",
                                 "--", testing::python(), dir + "/allreduce.py"},
                                120);
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  const std::string major = compat::kTorch2 ? "torch 2." : "torch 1.";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " of 2: sum 3, " + major))
        << r.out << r.err;
  }
  EXPECT_TRUE(contains(r.out, "agent store True")) << r.out;
}

// A program whose entry point PyTorch's @record wraps writes its exception to
// TORCHELASTIC_ERROR_FILE, and the launcher's report of the failed rank quotes it.
TEST(Torchrun, AFailedWorkersErrorFileIsQuoted) {
  DTORCH_SKIP_WITHOUT_PYTHON(false);
  const std::string dir = testing::scratch_dir("torchrun_error_file");
  std::ofstream(dir + "/fails.py") << R"PY(
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("the learning rate is negative")

main()
)PY";
  auto r = testing::run_command("torchrun_error_file_cmd",
                                {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node", "1",
                                 "--", testing::python(), dir + "/fails.py"},
                                60);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0's error file (TORCHELASTIC_ERROR_FILE) says: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "the learning rate is negative")) << r.err;
}

}  // namespace
}  // namespace dtorch::launch
