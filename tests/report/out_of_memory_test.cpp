// The out-of-memory message: the ZeRO formulas it quotes, what counts as an allocation
// failure, and a real run that runs out of address space naming its rank and the flags that
// would fit.
#include "dtorch/report/out_of_memory.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "support/command.h"

namespace dtorch::report {
namespace {

TEST(OutOfMemory, ModelStateFollowsTheZeroFormulas) {
  const double P = 1e6;
  EXPECT_DOUBLE_EQ(model_state_bytes(0, P, 4), 16 * P);
  EXPECT_DOUBLE_EQ(model_state_bytes(1, P, 4), 8 * P + 2 * P);
  EXPECT_DOUBLE_EQ(model_state_bytes(2, P, 4), 4 * P + 3 * P);
  EXPECT_DOUBLE_EQ(model_state_bytes(3, P, 4, 100), 4 * P + 100);
  EXPECT_DOUBLE_EQ(model_state_bytes(0, P, 4, 0, 4), 12 * P);  // SGD's momentum
}

TEST(OutOfMemory, RecognisesAllocationFailures) {
  EXPECT_TRUE(is_out_of_memory(std::bad_alloc()));
  EXPECT_TRUE(is_out_of_memory(std::runtime_error(
      "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: "
      "you tried to allocate 1000 bytes")));
  EXPECT_TRUE(is_out_of_memory(std::runtime_error("CUDA out of memory. Tried to allocate")));
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("shape mismatch")));
}

TEST(OutOfMemory, MessageNamesRankMemoryStrategiesAndFixes) {
  MemoryContext c;
  c.rank = 3;
  c.ranks = 4;
  c.model = "gpt-small";
  c.parameters = 124000000;
  c.zero_stage = 0;
  c.optimizer = "adamw";
  c.batch_size = 8;
  ProcessMemory m;
  m.rss = int64_t(3) << 30;
  m.peak_rss = int64_t(5) << 30;
  m.total = int64_t(24) << 30;
  const std::string s = out_of_memory_message("std::bad_alloc", c, m);
  for (const char* want :
       {"rank 3 ran out of memory (std::bad_alloc)", "3.00 GiB resident", "5.00 GiB at most",
        "24.0 GiB", "124M parameters", "ddp 1.85 GiB", "zero3 0.46 GiB", "--strategy zero3",
        "--activation-checkpointing", "--batch-size 4 with --accum-steps 2"})
    EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
  c.zero_stage = 3;
  c.activation_checkpointing = true;
  const std::string t = out_of_memory_message("x", c, m);
  EXPECT_EQ(t.find("--strategy zero3"), std::string::npos) << t;
  EXPECT_EQ(t.find("--activation-checkpointing"), std::string::npos) << t;
  EXPECT_EQ(t.find("--offload-optimizer cpu"), std::string::npos) << "nothing moves on the CPU";
  // On a GPU the state can go to the host (Note [State on the host]), unless it is there.
  c.device = at::Device(at::kCUDA, 0);
  const std::string gpu = out_of_memory_message("x", c, m);
  EXPECT_NE(gpu.find("--offload-optimizer cpu (the optimizer's state in host memory"),
            std::string::npos)
      << gpu;
  c.state_on_host = true;
  const std::string host = out_of_memory_message("x", c, m);
  EXPECT_EQ(host.find("--offload-optimizer cpu"), std::string::npos) << host;
}

// The optimizer's state the ranks of a node are still to make, against what the machine has:
// the report before the first step when it cannot fit, nothing when it can or nothing is known.
TEST(OutOfMemory, StateToComeIsReportedBeforeItIsMade) {
  MemoryContext c;
  c.model = "gpt-xl";
  c.parameters = 1557686400;
  c.ranks = 2;
  c.zero_stage = 3;
  ProcessMemory m;
  m.total = int64_t(24) << 30;
  m.available = int64_t(10) << 30;
  m.swap_free = int64_t(1) << 30;
  const double state = 8.0 * 1557686400 / 2;  // AdamW's moments, half the model per rank
  EXPECT_EQ(state_to_come_message(state, 1, c, m), "") << "6.2 GB fits in 11 GiB";
  const std::string s = state_to_come_message(state, 2, c, m);
  for (const char* want : {"before the first step: its adamw state, 5.80 GiB per rank for the 2 "
                           "rank(s) on this node, is more than the 11.0 GiB",
                           "--offload-optimizer nvme"})
    EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
  // A job's cgroup may leave less than the machine: 12 GiB allowed, 7 held already.
  m.cgroup_limit = int64_t(12) << 30;
  m.cgroup_usage = int64_t(7) << 30;
  const std::string job = state_to_come_message(state, 1, c, m);
  EXPECT_NE(job.find("more than the 5.00 GiB this job's cgroup and the machine have left"),
            std::string::npos)
      << job;
  m.cgroup_limit = 0;
  c.optimizer_on_disk = true;
  EXPECT_EQ(state_to_come_message(state, 2, c, m).find("--offload-optimizer"), std::string::npos);
  m.available = 0;  // not known
  EXPECT_EQ(state_to_come_message(state, 2, c, m), "");
}

TEST(TrainCli, OutOfMemoryNamesTheRankAndWhatWouldFit) {
  if (testing::kAddressSanitizer) GTEST_SKIP() << "ulimit -v leaves ASan no room to start";
  // gpt-small's DDP state with AdamW (1.85 GiB per rank) and its activations cannot fit 2 GB
  // of address space above what loading dtorch and LibTorch takes (found by trying
  // `dtorch version` under rising limits: it differs between LibTorch builds). Just below that,
  // OpenBLAS's start retries its buffers' allocation until killed, so a try gets 5 s, several
  // times what a start takes (0.6-0.9 s), rather than 10.
  const std::string out = ::testing::TempDir() + "/oom-run";
  auto r = testing::run_command(
      "train_oom_cmd",
      {"/bin/sh",
       "-c",
       "for kib in $(seq 250000 250000 16000000); do (ulimit -v $kib; timeout 5 \"$0\" "
       "version >/dev/null 2>&1) && break; done; ulimit -v $((kib + 2000000)); exec \"$0\" \"$@\"",
       DTORCH_CLI,
       "train",
       "--model",
       "gpt-small",
       "--data",
       "text",
       "--strategy",
       "ddp",
       "--optimizer",
       "adamw",
       "--batch-size",
       "2",
       "--seq-len",
       "32",
       "--train-samples",
       "8",
       "--test-samples",
       "4",
       "--epochs",
       "1",
       "--progress",
       "off",
       "--nproc-per-node",
       "2",
       "--out",
       out},
      240);
  EXPECT_NE(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "ran out of memory")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "--strategy zero3")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "gpt-small has 124M parameters")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "ulimit -v")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, "frame #")) << r.err;  // no stack trace
}

}  // namespace
}  // namespace dtorch::report
