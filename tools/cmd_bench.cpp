// `dtorch bench ddp`: DDP training throughput under the Python peer's protocol
// (bench/peer_ddp_mnist.py): uniformly random batches drawn by a per-rank
// generator, SGD lr 0.01 momentum 0.9, cross-entropy, warm-up steps not timed. Rank 0 prints
// one JSON line with the peer's fields plus where a step's time goes.
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "dtorch/core/device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/data/mnist_dataset.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/ddp/ddp.h"
#include "dtorch/train/strategy/strategy.h"
#include "dtorch/train/strategy/zero_grad.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct BenchFlags {
  std::string model = "mnist-cnn";
  int nproc_per_node = 1;
  int threads = 1;
  int64_t batch_size = 64;
  int steps = 200;
  int warmup = 20;
  std::string data_dir = data::kDefaultMnistDir;
  bool every_rank = false;              ///< every rank prints its line (to see skew between ranks)
  DeviceKind device = DeviceKind::CPU;  ///< Note [One GPU per rank]
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int bench_worker(const BenchFlags& f) {
  torch::set_num_threads(f.threads);
  torch::manual_seed(0);
  auto comm = comm::Communicator::from_env();
  const at::Device device = train::resolve_run_device(f.device, comm->info());
  auto train = data::load_mnist(f.data_dir, "train");
  train.images = train.images.to(device);
  train.labels = train.labels.to(device);
  auto model = models::make_model(f.model);
  model->to(device);
  std::shared_ptr<ddp::DistributedDataParallel> d;
  if (comm->size() > 1) d = ddp::wrap(model, comm);
  // DDP's policy at one rank too, as dtorch train has (Note [Returning released memory]).
  set_freed_memory(FreedMemory::Reuse);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto gen = at::detail::createCPUGenerator(comm->rank());
  double t_data = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, wait0 = 0;
  Clock::time_point t0;
  double loss_value = 0;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    if (step == f.warmup) {
      comm->barrier("bench start");
      t0 = Clock::now();
      t_data = t_fwd = t_bwd = t_opt = 0;
      wait0 = d ? d->comm_wait_seconds() : 0;
    }
    auto t = Clock::now();
    auto idx = torch::randint(0, train.size(), {f.batch_size}, gen).to(device);
    auto x = train.images.index_select(0, idx);
    auto y = train.labels.index_select(0, idx);
    synchronize(device);
    t_data += since(t);
    t = Clock::now();
    auto loss = torch::cross_entropy_loss(model->forward(x), y);
    synchronize(device);
    t_fwd += since(t);
    t = Clock::now();
    train::zero_grad_to_none(opt);  // the peer's zero_grad(set_to_none=True)
    loss.backward();
    synchronize(device);
    t_bwd += since(t);
    t = Clock::now();
    opt.step();
    synchronize(device);
    t_opt += since(t);
    if (step + 1 == f.warmup + f.steps) loss_value = loss.item<double>();
  }
  comm->barrier("bench end");
  double seconds = since(t0);
  if (comm->rank() != 0 && !f.every_rank) return 0;
  double wait = d ? d->comm_wait_seconds() - wait0 : 0;
  auto per_step_ms = [&](double s) { return 1000.0 * s / f.steps; };
  nlohmann::json j = {
      {"impl", "dtorch"},
      {"torch", TORCH_VERSION},
      {"model", f.model},
      {"device", device.str()},
      {"nproc", comm->size()},
      {"threads", f.threads},
      {"batch_per_rank", f.batch_size},
      {"steps", f.steps},
      {"seconds", seconds},
      {"samples_per_s", f.steps * f.batch_size * comm->size() / seconds},
      {"final_loss", loss_value},
      {"ms_per_step",
       {{"data", per_step_ms(t_data)},
        {"forward", per_step_ms(t_fwd)},
        {"backward_incl_comm_wait", per_step_ms(t_bwd)},
        {"comm_wait", per_step_ms(wait)},
        {"optimizer", per_step_ms(t_opt)}}},
  };
  std::cout << j.dump() << std::endl;
  return 0;
}

// Latency and bus bandwidth of one collective for one message size (like nccl-tests'
// all_reduce_perf): busbw = factor * bytes / time with nccl-tests' factors, the bytes each
// rank's link carries in a ring: 2 (n-1)/n for allreduce, (n-1)/n for reduce-scatter and
// allgather (bytes: the whole buffer, input of a reduce-scatter, output of an allgather).
int collective_worker(const std::string& op, int64_t bytes, int iters) {
  torch::set_num_threads(1);
  auto comm = comm::Communicator::from_env();
  const int n = comm->size();
  const int64_t numel = std::max<int64_t>(n, bytes / 4 / n * n);
  auto full = torch::ones({numel});
  auto part = torch::ones({numel / n});
  auto once = [&] {
    if (op == "allreduce") comm->allreduce(full);
    if (op == "reduce-scatter") comm->reduce_scatter(full, part);
    if (op == "allgather") comm->allgather_into(full, part);
  };
  for (int i = 0; i < 5; ++i)
    once();
  comm->barrier("bench start");
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i)
    once();
  double s = since(t0) / iters;
  if (comm->rank() == 0) {
    const double factor = (op == "allreduce" ? 2.0 : 1.0) * (n - 1) / n;
    nlohmann::json j = {{"impl", "dtorch"},
                        {"op", op},
                        {"nproc", n},
                        {"bytes", numel * 4},
                        {"ms", 1000 * s},
                        {"busbw_GBps", n > 1 ? factor * numel * 4 / s / 1e9 : 0.0},
                        {"path", env::get("DTORCH_SHM").value_or("1") == "0"
                                     ? "gloo (" + comm->options().gloo_collectives + ")"
                                     : "shared memory"},
                        {"torch", TORCH_VERSION}};
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

}  // namespace

// Note [Self-launch]: each benchmark prints one JSON line per rank shown, unprefixed.
std::optional<int> self_launch_bench(int nproc_per_node, bool every_rank) {
  SelfLaunch how;
  how.nproc_per_node = nproc_per_node;
  how.every_rank = every_rank;
  how.data_stdout = true;
  return self_launch(how);
}

void add_bench_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<BenchFlags>();
  auto* bench = app.add_subcommand("bench", "Benchmarks (results as one JSON line)");
  bench->require_subcommand(1);
  auto* cmd = bench->add_subcommand("ddp", "DDP training throughput, the peer's protocol");
  cmd->add_option("--model", f->model, "mnist-cnn | mnist-mlp")->capture_default_str();
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node)->capture_default_str();
  cmd->add_option("--threads", f->threads, "intra-op threads per rank")->capture_default_str();
  cmd->add_option("--batch-size", f->batch_size, "per rank")->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--data-dir", f->data_dir)->capture_default_str();
  add_choice_option(cmd, "--device", f->device, "cpu | cuda (one GPU per rank) | auto");
  cmd->add_flag("--every-rank", f->every_rank,
                "every rank prints its own line (time per phase differs when ranks are skewed)");
  cmd->callback([f, &exit_code] {
    DTORCH_CHECK_T(ConfigError,
                   f->nproc_per_node >= 1 && f->threads >= 1 && f->steps >= 1 && f->warmup >= 0 &&
                       f->batch_size >= 1,
                   "bench ddp: --nproc-per-node, --threads, --steps and --batch-size must be "
                   ">= 1, --warmup >= 0");
    auto launched = self_launch_bench(f->nproc_per_node, f->every_rank);
    exit_code = launched ? *launched : bench_worker(*f);
  });

  auto* ar = bench->add_subcommand(
      "allreduce",
      "Time and bus bandwidth of one collective (--op; DTORCH_SHM=0 for Gloo, "
      "DTORCH_GLOO_COLLECTIVES=native|dtorch to pick its reduce-scatter and allgather)");
  auto nproc = std::make_shared<int>(2);
  auto bytes = std::make_shared<int64_t>(4 << 20);
  auto iters = std::make_shared<int>(100);
  auto op = std::make_shared<std::string>("allreduce");
  ar->add_option("--nproc-per-node,--nproc_per_node", *nproc)->capture_default_str();
  ar->add_option("--bytes", *bytes, "message size")->capture_default_str();
  ar->add_option("--iters", *iters)->capture_default_str();
  ar->add_option("--op", *op, "allreduce | reduce-scatter | allgather")
      ->check(CLI::IsMember({"allreduce", "reduce-scatter", "allgather"}))
      ->capture_default_str();
  ar->callback([=, &exit_code] {
    DTORCH_CHECK_T(ConfigError, *nproc >= 1 && *bytes >= 4 && *iters >= 1,
                   "bench allreduce: --nproc-per-node and --iters must be >= 1, --bytes >= 4");
    auto launched = self_launch_bench(*nproc, false);
    exit_code = launched ? *launched : collective_worker(*op, *bytes, *iters);
  });
  add_bench_memory_command(*bench, exit_code);
  add_bench_checkpoint_command(*bench, exit_code);
  add_bench_data_command(*bench, exit_code);
  add_bench_optimizer_command(*bench, exit_code);
}

}  // namespace dtorch::tools
