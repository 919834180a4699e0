// `dtorch train --device cuda` as a GPU user runs it, each run compared with the same run on
// the CPU: every strategy at one rank; every layout at two ranks sharing the GPU over Gloo (Note
// [CUDA tensors over Gloo]); with the optimizer's state on the host or on disk (Note [State on
// the host]), and the GPU's peak lower for it; checkpoints written on the GPU resuming on the
// CPU and the other way; fp16 with loss scaling and bf16; more ranks than GPUs and memory
// running out, said so.
// Skipped without a GPU (scripts/gpu-check runs them on one); the CPU side of each comparison
// is the code the rest of the suite runs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch {
namespace {

bool have_gpu() {
  return cuda_availability().visible > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible (or a LibTorch without CUDA)"

// Losses of two runs of the same training on two devices: float32 on a GPU sums in other
// orders than on the CPU, so they agree to about 1e-5 relative a step; after a few hundred
// steps of AdamW, to a few 1e-3.
void expect_close_runs(const std::string& got, const std::string& want, const std::string& name,
                       double tolerance = 5e-3) {
  auto g = testing::epochs_of(got), w = testing::epochs_of(want);
  ASSERT_EQ(g.size(), w.size()) << name;
  ASSERT_FALSE(g.empty()) << name;
  for (size_t e = 0; e < g.size(); ++e) {
    for (const char* key : {"train_loss", "test_loss"}) {
      EXPECT_NEAR(g[e][key].get<double>(), w[e][key].get<double>(), tolerance)
          << name << " epoch " << e << " " << key;
    }
  }
}

// Trains gpt-debug as testing::gpt_debug_train_args does, on `device`, with `more` flags.
testing::CommandResult train_on(const std::string& device, const std::string& out,
                                const std::string& strategy, int nproc, int epochs,
                                const std::vector<std::string>& more = {},
                                const std::vector<std::string>& env = {}) {
  // Few threads: gpu-check runs these tests side by side, and a CPU run with a thread per core
  // each slows them all down tenfold.
  auto args = testing::with(testing::gpt_debug_train_args(out, strategy, nproc, epochs),
                            {"--device", device, "--threads", "2"});
  args = testing::with(args, more);
  return testing::run_command(str("train_", device, "_", strategy, nproc), args, 300, env);
}

struct Layout {
  const char* name;
  const char* strategy;
  std::vector<std::string> flags;
};
// What gtest (and ctest's test name) shows of a layout: its name, not its bytes.
void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.name;
}

class CudaTrainOneRank : public ::testing::TestWithParam<Layout> {};

TEST_P(CudaTrainOneRank, GivesTheCpuRunsLosses) {
  SKIP_WITHOUT_GPU();
  const Layout& l = GetParam();
  const std::string dir = testing::scratch_dir(str("cuda1_", l.name));
  auto gpu = train_on("cuda", dir + "/gpu", l.strategy, 1, 2, l.flags);
  ASSERT_EQ(gpu.exit_code(), 0) << gpu.err;
  EXPECT_TRUE(testing::contains(gpu.err, "device: cuda:0")) << gpu.err;
  auto cpu = train_on("cpu", dir + "/cpu", l.strategy, 1, 2, l.flags);
  ASSERT_EQ(cpu.exit_code(), 0) << cpu.err;
  expect_close_runs(dir + "/gpu", dir + "/cpu", l.name);
  // The epoch records carry the GPU allocator's peaks.
  auto e = testing::epochs_of(dir + "/gpu");
  EXPECT_GT(e.back().value("gpu_peak_allocated_bytes", 0.0), 0.0) << e.back().dump();
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, CudaTrainOneRank,
    ::testing::Values(Layout{"ddp", "ddp", {}}, Layout{"zero1", "zero1", {}},
                      Layout{"zero2", "zero2", {}}, Layout{"zero3", "zero3", {}},
                      Layout{"ddp_checkpointed",
                             "ddp",
                             {"--activation-checkpointing", "--phase-times", "--print-every", "4"}},
                      Layout{"zero3_clipped", "zero3", {"--clip-grad-norm", "0.5"}},
                      Layout{"ddp_accumulated", "ddp", {"--accum-steps", "2"}},
                      Layout{"zero1_state_on_host", "zero1", {"--offload-optimizer", "cpu"}},
                      Layout{"zero2_state_on_host_accumulated",
                             "zero2",
                             {"--offload-optimizer", "cpu", "--accum-steps", "2"}},
                      Layout{"zero3_state_on_host_clipped",
                             "zero3",
                             {"--offload-optimizer", "cpu", "--clip-grad-norm", "0.5"}}),
    [](const auto& info) { return std::string(info.param.name); });

class CudaTrainSharedGpu : public ::testing::TestWithParam<Layout> {};

// Two ranks on one GPU, their CUDA tensors carried over Gloo: the multi-rank code of every
// layout on CUDA tensors (NCCL itself needs a GPU per rank).
TEST_P(CudaTrainSharedGpu, TwoRanksGiveTheCpuRunsLosses) {
  SKIP_WITHOUT_GPU();
  const Layout& l = GetParam();
  const std::string dir = testing::scratch_dir(str("cuda2_", l.name));
  const std::vector<std::string> gloo{"DTORCH_BACKEND=gloo"};
  auto gpu = train_on("cuda", dir + "/gpu", l.strategy, 2, 1, l.flags, gloo);
  ASSERT_EQ(gpu.exit_code(), 0) << gpu.err;
  auto cpu = train_on("cpu", dir + "/cpu", l.strategy, 2, 1, l.flags, gloo);
  ASSERT_EQ(cpu.exit_code(), 0) << cpu.err;
  expect_close_runs(dir + "/gpu", dir + "/cpu", l.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CudaTrainSharedGpu,
    ::testing::Values(Layout{"ddp", "ddp", {}}, Layout{"zero2", "zero2", {}},
                      Layout{"zero3", "zero3", {}}, Layout{"tp2", "ddp", {"--tp", "2"}},
                      Layout{"tp2_sp", "ddp", {"--tp", "2", "--sequence-parallel"}},
                      Layout{"pp2", "ddp", {"--pp", "2"}},
                      Layout{"pp2_zb", "zero1", {"--pp", "2", "--schedule", "zb"}},
                      Layout{"tp2_zero3", "zero3", {"--tp", "2"}},
                      Layout{"pp2_zero3", "zero3", {"--pp", "2", "--reshard-after-microbatch"}},
                      Layout{"zero2_state_on_host", "zero2", {"--offload-optimizer", "cpu"}},
                      Layout{"zero3_state_on_disk",
                             "zero3",
                             {"--offload-optimizer", "nvme", "--offload-params", "nvme",
                              "--offload-dir", "/tmp"}}),
    [](const auto& info) { return std::string(info.param.name); });

// Checkpoints hold host tensors: a run stopped on the GPU resumes on the CPU and the other way,
// and goes on as the run that was never stopped.
TEST(CudaTrain, CheckpointsMoveBetweenGpuAndCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string strategy : {"ddp", "zero2"}) {
    const std::string dir = testing::scratch_dir("cuda_ckpt_" + strategy);
    auto whole = train_on("cpu", dir + "/whole", strategy, 1, 2);
    ASSERT_EQ(whole.exit_code(), 0) << whole.err;
    for (const auto& [first, then] : {std::pair<std::string, std::string>{"cuda", "cpu"},
                                      std::pair<std::string, std::string>{"cpu", "cuda"}}) {
      const std::string out = dir + "/" + first + "_then_" + then;
      auto a = train_on(first, out, strategy, 1, 1);
      ASSERT_EQ(a.exit_code(), 0) << a.err;
      auto b = train_on(then, out, strategy, 1, 2, {"--resume"});
      ASSERT_EQ(b.exit_code(), 0) << b.err;
      EXPECT_TRUE(testing::contains(b.err, "resuming from")) << b.err;
      expect_close_runs(out, dir + "/whole", strategy + " " + first + " then " + then);
    }
  }
}

// Note [State on the host]: the masters, their gradients and AdamW's moments leave the GPU,
// and fp16's overflow flag reaches the host's step.
TEST(CudaTrain, StateOnTheHostLowersTheGpuPeak) {
  SKIP_WITHOUT_GPU();
  const std::string dir = testing::scratch_dir("cuda_state_on_host");
  double peak[2] = {0, 0};
  for (int host = 0; host < 2; ++host) {
    const std::string out = str(dir, "/", host ? "host" : "device");
    auto r = train_on("cuda", out, "zero2", 1, 1,
                      {"--precision", "fp16", "--offload-optimizer", host ? "cpu" : "none"});
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    if (host) EXPECT_TRUE(testing::contains(r.err, "stepped on the host")) << r.err;
    auto e = testing::epochs_of(out);
    ASSERT_FALSE(e.empty());
    peak[host] = e.back().value("gpu_peak_allocated_bytes", 0.0);
  }
  EXPECT_LT(peak[1], peak[0]) << "GPU peak with the state on the host " << peak[1]
                              << " bytes, on the GPU " << peak[0];
}

// fp16 compute with dynamic loss scaling learns as fp32 does, and records its scale; bf16 too.
TEST(CudaTrain, Fp16AndBf16FollowTheFp32Run) {
  SKIP_WITHOUT_GPU();
  const std::string dir = testing::scratch_dir("cuda_precision");
  auto fp32 = train_on("cuda", dir + "/fp32", "ddp", 1, 2);
  ASSERT_EQ(fp32.exit_code(), 0) << fp32.err;
  for (const std::string strategy : {"ddp", "zero2"}) {
    for (const std::string precision : {"fp16", "bf16"}) {
      const std::string out = dir + "/" + precision + "_" + strategy;
      auto r = train_on("cuda", out, strategy, 1, 2, {"--precision", precision});
      ASSERT_EQ(r.exit_code(), 0) << r.err;
      auto e = testing::epochs_of(out), f = testing::epochs_of(dir + "/fp32");
      ASSERT_EQ(e.size(), 2u);
      EXPECT_LT(e[1]["train_loss"].get<double>(), e[0]["train_loss"].get<double>()) << precision;
      EXPECT_NEAR(e[1]["train_loss"].get<double>(), f[1]["train_loss"].get<double>(), 0.1)
          << precision << " " << strategy;
      if (precision == "fp16") {
        EXPECT_GE(e[1].value("loss_scale", 0.0), 1.0) << e[1].dump();
        EXPECT_TRUE(e[1].contains("skipped_steps")) << e[1].dump();
      }
    }
  }
}

TEST(CudaTrain, MoreRanksThanGpusIsAConfigErrorNamingBoth) {
  SKIP_WITHOUT_GPU();
  const int gpus = cuda_availability().visible;
  const std::string dir = testing::scratch_dir("cuda_too_many");
  auto r = train_on("cuda", dir + "/run", "ddp", gpus + 1, 1);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, str(gpus + 1, " local ranks but ", gpus, " visible GPU")))
      << r.err;
  EXPECT_TRUE(testing::contains(r.err, "CUDA_VISIBLE_DEVICES")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, "invalid device ordinal")) << r.err;
}

TEST(CudaTrain, RunningOutOfGpuMemorySaysWhatWouldFit) {
  SKIP_WITHOUT_GPU();
  const std::string out = testing::scratch_dir("cuda_oom") + "/run";
  // gpt-small's logits for every 1024-byte window of the corpus at once (thousands x 1024 x
  // 50304 floats) do not fit any GPU.
  auto r = testing::run_command("train_cuda_oom",
                                {DTORCH_CLI, "train", "--model", "gpt-small", "--data", "text",
                                 "--seq-len", "1024", "--batch-size", "1000000", "--epochs", "1",
                                 "--device", "cuda", "--progress", "off", "--out", out},
                                300);
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(testing::contains(r.err, "ran out of memory")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "on cuda:0")) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "To fit")) << r.err;
}

}  // namespace
}  // namespace dtorch
