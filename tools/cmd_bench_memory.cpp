// `dtorch bench memory`: the model-state bytes each rank holds under a strategy (counted from
// the toolkit's own buffers), the ZeRO paper's formula for them, the process's peak RSS, the
// bytes each rank sends per step, and throughput: one JSON line per rank. With --tp (--pp), the
// strategy runs over the dp group of a dp x tp (x pp) mesh; under a pipeline each line also has
// the rank's measured and simulated bubble and activations held; with --activation-checkpointing
// the blocks recompute their forward in backward; with --cp each rank keeps 1/cp of every
// sequence and its line has the attention bytes sent against Note [Ring attention]'s or Note
// [Ulysses]'s count. Without a pipeline each line also says where
// a step's time went: forward, backward, the optimizer step, and the communication waits
// within them. Bytes kept from forward to backward, and the peak from forward to the end of
// backward, are counted at the allocator (Note [Allocation meter]).
#include <sys/resource.h>
#include <torch/version.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <optional>

#include "dtorch/core/allocation_meter.h"
#include "dtorch/core/device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/report/profiler.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/run_config.h"
#include "dtorch/train/step_stats.h"
#include "dtorch/train/strategy.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

struct MemoryFlags {
  train::StrategyConfig strategy;
  std::string model = "gpt-debug";
  int nproc_per_node = 1;
  int threads = 1;
  int64_t batch_size = 2;
  int64_t seq_len = 64;
  int warmup_steps = 1;  ///< untimed steps before the timed ones
  int steps = 3;         ///< timed steps
  /// tp, pp (dp = world / (tp pp)) and recomputation, as `dtorch train` takes them
  train::ParallelismConfig parallelism;
  int64_t image_size = 0;  ///< image models: side of the square input (0: 28)
  int64_t classes = 0;     ///< image models: classes (0: 10)
  std::string profile;     ///< steps to trace, FIRST:LAST over all steps run (report/profiler.h)
  std::string out = ".";   ///< where --profile writes trace.rank<N>.json
};

using train::Clock;
using train::seconds_since;

int memory_worker(MemoryFlags f) {
  torch::set_num_threads(f.threads);
  auto world = comm::Communicator::from_env();
  const at::Device device = train::resolve_run_device(f.strategy.device, world->info());
  report::StepProfiler profiler(report::parse_step_range(f.profile, "--profile"),
                                report::trace_path(f.out, world->rank()), device);
  torch::manual_seed(0);
  models::ImageInput input;
  if (f.image_size > 0) input = {3, f.image_size, f.classes > 0 ? f.classes : 1000};
  // The whole model's parameters; each rank builds and holds only its part of them.
  const int64_t P = models::model_parameters(f.model, input);
  train::ParallelizeSpec spec;
  spec.model = f.model;
  spec.input = input;
  spec.parallelism = f.parallelism;
  spec.strategy = f.strategy;
  spec.device = device;
  int64_t P_local = 0;  // what the rank's model holds before the strategy shards it
  train::Parallelized run = train::parallelize(spec, world, [&](const models::Model& m) {
    for (const auto& p : m.parameters())
      P_local += p.numel();
  });
  const std::shared_ptr<models::Model>& model = run.model;
  const train::Layout& layout = run.layout;
  const std::unique_ptr<train::Strategy>& strategy = run.strategy;
  DTORCH_CHECK_T(ConfigError, !layout.cp || dynamic_cast<const models::GPT*>(model.get()),
                 "bench memory --cp counts the bytes of a GPT's attention, and ", f.model,
                 " is not a GPT: use a gpt-* model, or measure ", f.model,
                 " with dtorch train --cp");
  pp::Pipeline* pipeline = layout.pp.pipeline.get();
  const std::shared_ptr<comm::Communicator>& dp = layout.dp;
  const tp::TensorParallel* tensor_parallel = layout.tp.handle.get();
  // The ranks of one model replica (its tp and pp ranks) share their batch.
  auto gen = at::detail::createCPUGenerator(layout.plan.dp_index(world->rank()));
  // Capped at the model's block size (gpt-debug's is 32).
  const int64_t T = std::min(f.seq_len, model->max_sequence_length());
  // Random batches made once, in the rank's device memory: what is timed is the step, not
  // the making or the copying of data (dtorch train's data path is timed by dtorch train).
  const int64_t side = f.image_size > 0 ? f.image_size : 28, channels = f.image_size > 0 ? 3 : 1;
  const int64_t classes = f.image_size > 0 ? input.classes : 10;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int k = 0; k < 2; ++k) {
    if (model->takes_tokens()) {
      // Under context parallelism the rank keeps its tokens of its replica's sequences.
      batches.emplace_back(
          layout.local_tokens(torch::randint(0, 256, {f.batch_size, T}, gen).to(device)),
          layout.local_tokens(torch::randint(0, 256, {f.batch_size, T}, gen).to(device)));
    } else {
      batches.emplace_back(torch::randn({f.batch_size, channels, side, side}, gen).to(device),
                           torch::randint(0, classes, {f.batch_size}, gen).to(device));
    }
  }
  int next_batch = 0;
  auto batch = [&] { return batches[next_batch++ % batches.size()]; };
  auto reset = [&] {
    dp->reset_traffic();
    if (tensor_parallel) tensor_parallel->group()->reset_traffic();
    if (layout.cp) layout.cp->group()->reset_traffic();
  };
  Clock::time_point t0, step_start;
  std::vector<double> step_seconds;  // each timed step's
  const bool sync_errors = device.is_cuda() && env::get("DTORCH_SYNC_ERRORS").value_or("") == "1";
  double pipeline_seconds = 0, compute_seconds = 0;
  int peak_activations = 0;
  // Bytes allocated during the timed steps (Note [Allocation meter]): kept from forward to
  // backward (activations; without a pipeline), and the most held from the start of forward
  // to the end of backward, above what the step began with (the optimizer step not included).
  std::optional<AllocationMeter> meter;
  int64_t forward_bytes = 0, step_peak_bytes = 0, step_base = 0;
  // Where a timed step's time goes (without a pipeline): forward, backward and the optimizer
  // step, each including the communication waits counted apart (Strategy::comm_waits). On a
  // GPU the phases are CUDA events, read after the last step: a step synchronizes once, at its
  // end, as a training step never does.
  train::PhaseTimes phases(true, device);
  zero::WaitSeconds waits0;
  // Page faults of the timed steps: memory the kernel had to clear and map again (Note
  // [Returning released memory]).
  int64_t faults0 = 0;
  auto minor_faults = [] {
    struct rusage now {};
    getrusage(RUSAGE_SELF, &now);
    return static_cast<int64_t>(now.ru_minflt);
  };
  for (int step = 0; step < f.warmup_steps + f.steps; ++step) {
    const bool timed = step >= f.warmup_steps;
    if (step == f.warmup_steps) {
      synchronize(device);
      world->barrier("bench start");
      reset();
      reset_peak_memory(device);
      // The meter takes the thread's profiler slot (Note [Allocation meter]): under --profile
      // Kineto has it, and the bytes the meter counts are not reported.
      if (f.profile.empty()) meter.emplace();
      t0 = Clock::now();
      phases.take_mean_ms(1);  // the untimed steps' phases are not counted
      waits0 = strategy->comm_waits();
      faults0 = minor_faults();
    }
    profiler.before_step(step + 1);
    step_start = Clock::now();
    if (meter) {
      step_base = meter->current();
      meter->reset_peak();
    }
    // With DTORCH_SYNC_ERRORS=1 a timed step on a GPU throws at any wait for the device before
    // its end (scripts/gpu-check; Note [No host sync in a step]).
    set_sync_errors(timed && sync_errors);
    // Named members, not a structured binding: lambdas below use them (C++17 cannot capture one).
    const auto xy = batch();
    const torch::Tensor& x = xy.first;
    const torch::Tensor& y = xy.second;
    if (pipeline) {
      pp::PipelineStepResult r;
      strategy->backward_accumulated([&] {
        TraceRange range("forward_backward");
        parallel::Autocast autocast(strategy->autocast());
        r = pipeline->step(x, y, [&](const torch::Tensor& out, const torch::Tensor& t) {
          return train::cross_entropy(out, t, tensor_parallel);
        });
      });
      if (meter) step_peak_bytes = std::max(step_peak_bytes, meter->peak() - step_base);
      {
        TraceRange range("optimizer");
        strategy->step(0);
      }
      if (timed) {
        pipeline_seconds += r.seconds;
        compute_seconds += r.compute_seconds;
      }
      peak_activations = std::max(peak_activations, r.peak_activations);
    } else {
      torch::Tensor loss;
      phases.start();
      {
        TraceRange range("forward");
        parallel::Autocast autocast(strategy->autocast());
        loss = train::cross_entropy(model->forward(x), y, tensor_parallel);
      }
      phases.lap("forward");
      if (meter) forward_bytes = std::max(forward_bytes, meter->current() - step_base);
      {
        TraceRange range("backward");
        strategy->backward(loss, true);
      }
      phases.lap("backward");
      if (meter) step_peak_bytes = std::max(step_peak_bytes, meter->peak() - step_base);
      {
        TraceRange range("optimizer");
        strategy->step(0);
      }
      phases.lap("optimizer");
    }
    set_sync_errors(false);
    if (timed) {
      synchronize(device);
      step_seconds.push_back(seconds_since(step_start));
    }
    profiler.after_step(step + 1);
  }
  world->barrier("bench end");
  double seconds = seconds_since(t0);
  comm::Traffic traffic = dp->traffic(), tp_traffic, cp_traffic;
  if (tensor_parallel) tp_traffic = tensor_parallel->group()->traffic();
  if (layout.cp) cp_traffic = layout.cp->group()->traffic();
  auto m = strategy->memory();
  const DeviceMemory gpu = device_memory(device);

  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double faults_per_step = double(ru.ru_minflt - faults0) / f.steps;
  // Note [Kept large buffers]: a steady step should fault in a small share of the pages its
  // gradients span.
  const double grad_pages = double(m.grad_bytes) / double(sysconf(_SC_PAGESIZE));
  const int n = dp->size();
  // The ZeRO formulas over the dp group, for the parameters this rank holds.
  double expected = report::model_state_bytes(train::zero_stage(f.strategy.kind), double(P_local),
                                              n, double(m.resident_unit_bytes));
  auto per_step = [&](const comm::Traffic& t) {
    return nlohmann::json{{"allreduce", t.allreduce / f.steps},
                          {"reduce_scatter", t.reduce_scatter / f.steps},
                          {"allgather", t.allgather / f.steps},
                          {"broadcast", t.broadcast / f.steps},
                          {"total", t.total() / f.steps}};
  };
  const int64_t sent = traffic.total() + tp_traffic.total() + cp_traffic.total();
  nlohmann::json j = {
      {"impl", "dtorch"},
      {"bench", "memory"},
      {"torch", TORCH_VERSION},
      {"model", f.model},
      {"strategy", name_of(f.strategy.kind)},
      {"precision", name_of(f.strategy.precision.compute)},
      {"nproc", world->size()},
      {"dp", layout.data_ranks()},
      {"tp", f.parallelism.tp},
      {"rank", world->rank()},
      {"params", P},
      {"params_local", P_local},
      {"param_bytes", m.param_bytes},
      {"grad_bytes", m.grad_bytes},
      {"optim_bytes", m.optim_bytes},
      {"model_state_bytes", m.total()},
      {"peak_param_bytes", m.peak_param_bytes},
      {"resident_unit_bytes", m.resident_unit_bytes},
      {"formula_bytes", expected},
      {"model_state_over_formula", m.total() / expected},
      {"peak_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024},
      {"device", device.str()},
      {"gpu", gpu_name(device)},
      {"cuda_peak_allocated_bytes", gpu.peak_allocated},
      {"cuda_peak_reserved_bytes", gpu.peak_reserved},
      {"batch_size", f.batch_size},
      {"seq_len", model->takes_tokens() ? T : 0},
      {"image_size", model->takes_tokens() ? 0 : side},
      {"samples_per_s", f.steps * f.batch_size * layout.data_ranks() / seconds},
      {"page_faults_per_step", faults_per_step},
      {"page_faults_per_grad_page", grad_pages > 0 ? faults_per_step / grad_pages : 0.0},
      {"step_seconds", seconds / f.steps},
      {"timed_step_seconds", step_seconds},
      {"step_seconds_median", train::median_seconds(step_seconds)},
      {"activation_checkpointing", f.parallelism.activation_checkpointing},
      {"forward_backward_peak_bytes", meter ? nlohmann::json(step_peak_bytes) : nlohmann::json()},
      {"bytes_sent_per_step", per_step(traffic)},
      {"tp_bytes_sent_per_step", per_step(tp_traffic)},
      {"cp", f.parallelism.cp},
      {"sent_per_step_over_param_bytes", double(sent) / f.steps / (4.0 * P)},
  };
  if (layout.cp) {
    // Note [Ring attention], Note [Ulysses]: every block's attention, forward and backward
    // (and forward again for each block that recomputes it).
    const auto* gpt = dynamic_cast<const models::GPT*>(model.get());
    DTORCH_CHECK(gpt, "bench memory --cp: ", f.model, " is not a GPT");
    const models::GPTConfig& g = gpt->config();
    const int n_cp = f.parallelism.cp;
    const int every = f.parallelism.activation_checkpointing;
    const int64_t recomputed = every > 0 ? (g.n_layer + every - 1) / every : 0;
    const int64_t element = strategy->autocast().enabled ? 2 : 4;
    const int64_t heads = g.n_head / f.parallelism.tp, local = T / n_cp;
    const cp::LayerBytes layer = cp::bytes_sent_per_layer(
        f.parallelism.cp_kind, n_cp, f.batch_size, heads, local, g.n_embd / g.n_head, element);
    j["cp_kind"] = name_of(f.parallelism.cp_kind);
    j["tokens_per_rank"] = local;
    j["cp_bytes_sent_per_step"] = cp_traffic.send / f.steps;
    j["cp_formula_bytes_per_step"] =
        g.n_layer * (layer.forward + layer.backward) + recomputed * layer.forward;
  }
  if (!pipeline) {
    j["forward_kept_bytes"] = meter ? nlohmann::json(forward_bytes) : nlohmann::json();
    const zero::WaitSeconds waits = strategy->comm_waits();
    const std::map<std::string, double> ms = phases.take_mean_ms(f.steps);
    auto phase = [&](const char* name) { return ms.count(name) ? ms.at(name) / 1e3 : 0.0; };
    j["phase_seconds"] = {{"forward", phase("forward")},
                          {"backward", phase("backward")},
                          {"optimizer", phase("optimizer")},
                          {"gather_wait", (waits.gather - waits0.gather) / f.steps},
                          {"reduce_wait", (waits.reduce - waits0.reduce) / f.steps}};
  }
  if (pipeline) {
    // The bubble as measured (time not spent in forward or backward, over the step) and as
    // the on-paper simulator gives it with equal F, B and W times.
    const auto sim = pp::simulate(pipeline->schedule(), f.parallelism.microbatches);
    const int pp_rank = pipeline->group().rank();
    j["pp"] = f.parallelism.pp;
    j["pp_rank"] = pp_rank;
    j["schedule"] = name_of(f.parallelism.schedule);
    j["microbatches"] = f.parallelism.microbatches;
    j["idle_fraction"] = 1.0 - compute_seconds / pipeline_seconds;
    j["simulated_idle_fraction"] = sim.idle_fraction[pp_rank];
    j["peak_activations"] = peak_activations;
    j["simulated_peak_activations"] = sim.peak_activations[pp_rank];
    nlohmann::json units = nlohmann::json::array();  // per stage this rank runs
    for (int s : layout.pp.stages)
      units.push_back({layout.pp.plan.stages[s].begin, layout.pp.plan.stages[s].end});
    j["stages_units"] = units;
  }
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void add_bench_memory_command(CLI::App& bench, int& exit_code) {
  auto f = std::make_shared<MemoryFlags>();
  f->strategy.optimizer.kind = train::OptimizerKind::AdamW;
  f->strategy.optimizer.weight_decay = 0.01;  // AdamW's default in PyTorch, as the peers run it
  f->strategy.optimizer.lr = 1e-4;
  auto* cmd = bench.add_subcommand(
      "memory", "Model-state bytes per rank against the ZeRO formulas, peak RSS, traffic");
  cmd->add_option("--model", f->model)->capture_default_str();
  add_strategy_options(cmd, f->strategy);
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node)->capture_default_str();
  cmd->add_option("--threads", f->threads, "intra-op threads per rank")->capture_default_str();
  cmd->add_option("--batch-size", f->batch_size, "per rank")->capture_default_str();
  cmd->add_option("--seq-len", f->seq_len, "tokens per sequence (gpt)")->capture_default_str();
  cmd->add_option("--warmup-steps", f->warmup_steps, "untimed steps before the timed ones")
      ->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps, after the untimed ones")
      ->capture_default_str();
  add_parallelism_options(cmd, f->parallelism);
  cmd->add_option("--image-size", f->image_size,
                  "image models: random 3-channel images of this side (default: 1 x 28 x 28)");
  cmd->add_option("--classes", f->classes, "image models with --image-size: classes (1000)");
  cmd->add_option("--profile", f->profile,
                  "trace steps FIRST:LAST (counting the untimed ones) with LibTorch's profiler "
                  "into --out/trace.rank<N>.json");
  cmd->add_option("--out", f->out, "the folder --profile writes its traces into")
      ->capture_default_str();
  cmd->callback([f, &exit_code] {
    DTORCH_CHECK_T(
        ConfigError,
        f->nproc_per_node >= 1 && f->threads >= 1 && f->steps >= 1 && f->warmup_steps >= 1 &&
            f->batch_size >= 1 && f->seq_len >= 1 && f->image_size >= 0 && f->classes >= 0,
        "bench memory: --nproc-per-node, --threads, --warmup-steps, --steps, --batch-size and "
        "--seq-len must be >= 1, --image-size and --classes >= 0 (got ",
        f->nproc_per_node, ", ", f->threads, ", ", f->warmup_steps, ", ", f->steps, ", ",
        f->batch_size, ", ", f->seq_len, ", ", f->image_size, " and ", f->classes, ")");
    const report::StepRange profiled = report::parse_step_range(f->profile, "--profile");
    DTORCH_CHECK_T(ConfigError, profiled.last <= f->warmup_steps + f->steps, "--profile ",
                   f->profile, " ends after the last step this runs (", f->warmup_steps + f->steps,
                   ": --warmup-steps ", f->warmup_steps, " + --steps ", f->steps,
                   "); trace steps within it, or raise --steps");
    if (!profiled.empty()) report::require_profiler();
    train::ParallelismConfig& p = f->parallelism;
    train::validate(p);
    if (p.pp > 1 && p.microbatches == 0) {  // Note [Micro-batches]
      p.microbatches = train::default_microbatches(p.pp, p.schedule, f->batch_size);
    }
    train::validate(f->strategy);
    auto launched = self_launch_bench(f->nproc_per_node, true);
    exit_code = launched ? *launched : memory_worker(*f);
  });
}

}  // namespace dtorch::tools
