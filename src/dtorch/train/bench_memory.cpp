// `dtorch bench memory`'s measurement of one layout on this rank: the model-state bytes it
// holds under a strategy (counted from the toolkit's own buffers) against the ZeRO paper's
// formula for them, the process's peak RSS, the bytes it sends per step, and throughput. With
// --tp (--pp), the strategy runs over the dp group of a dp x tp (x pp) mesh; under a pipeline it
// also has the rank's measured and simulated bubble and activations held; with
// --activation-checkpointing the blocks recompute their forward in backward; with --cp each rank
// keeps 1/cp of every sequence and it has the attention bytes sent against Note [Ring
// attention]'s or Note [Ulysses]'s count. Without a pipeline it also says where a step's time
// went: forward, backward, the optimizer step, and the communication waits within them. Bytes
// kept from forward to backward, and the peak from forward to the end of backward, are counted
// at the allocator (Note [Allocation meter]).
#include "dtorch/train/bench_memory.h"

#include <sys/resource.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/allocation_meter.h"
#include "dtorch/core/device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/models/model.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/report/profiler.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/step_stats.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::train {

nlohmann::json bench_memory(const BenchMemoryConfig& c,
                            const std::shared_ptr<comm::Communicator>& world) {
  const at::Device device = resolve_run_device(c.strategy.device, world->info());
  report::StepProfiler profiler(report::parse_step_range(c.profile, "--profile"),
                                report::trace_path(c.out, world->rank()), device);
  torch::manual_seed(0);
  models::ImageInput input;
  if (c.image_size > 0) input = {3, c.image_size, c.classes > 0 ? c.classes : 1000};
  // The whole model's parameters; each rank builds and holds only its part of them.
  const int64_t P = models::model_parameters(c.model, input);
  ParallelizeSpec spec;
  spec.model = c.model;
  spec.input = input;
  spec.parallelism = c.parallelism;
  spec.strategy = c.strategy;
  spec.device = device;
  int64_t P_local = 0;  // what the rank's model holds before the strategy shards it
  Parallelized run = parallelize(spec, world, [&](const models::Model& m) {
    for (const auto& p : m.parameters())
      P_local += p.numel();
  });
  const std::shared_ptr<models::Model>& model = run.model;
  const Layout& layout = run.layout;
  const std::unique_ptr<Strategy>& strategy = run.strategy;
  // The attention's shape, as the model reports it (Model::workload): a GPT's is a language
  // model's.
  const models::Workload shape = model->workload();
  DTORCH_CHECK_T(ConfigError, !layout.cp || (shape.language() && shape.transformer()),
                 "bench memory --cp counts the bytes of a GPT's attention, and ", c.model,
                 " is not a GPT: use a gpt-* model, or measure ", c.model,
                 " with dtorch train --cp");
  pp::Pipeline* pipeline = layout.pp.pipeline.get();
  const std::shared_ptr<comm::Communicator>& dp = layout.dp;
  const tp::TensorParallel* tensor_parallel = layout.tp.handle.get();
  // The ranks of one model replica (its tp and pp ranks) share their batch.
  auto gen = at::detail::createCPUGenerator(layout.plan.dp_index(world->rank()));
  // Capped at the model's block size (gpt-debug's is 32).
  const int64_t T = std::min(c.seq_len, model->max_sequence_length());
  // Random batches made once, in the rank's device memory: what is timed is the step, not
  // the making or the copying of data (dtorch train's data path is timed by dtorch train).
  const int64_t side = c.image_size > 0 ? c.image_size : 28, channels = c.image_size > 0 ? 3 : 1;
  const int64_t classes = c.image_size > 0 ? input.classes : 10;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int k = 0; k < 2; ++k) {
    if (model->takes_tokens()) {
      // Under context parallelism the rank keeps its tokens of its replica's sequences.
      batches.emplace_back(
          layout.local_tokens(torch::randint(0, 256, {c.batch_size, T}, gen).to(device)),
          layout.local_tokens(torch::randint(0, 256, {c.batch_size, T}, gen).to(device)));
    } else {
      batches.emplace_back(torch::randn({c.batch_size, channels, side, side}, gen).to(device),
                           torch::randint(0, classes, {c.batch_size}, gen).to(device));
    }
  }
  int next_batch = 0;
  auto batch = [&] { return batches[next_batch++ % batches.size()]; };
  // Note [Hybrid sharding]: the strategy's collectives go through a replica's shard group and
  // the replicate group, not the dp group.
  const HybridSharding& hybrid = layout.hybrid;
  auto reset = [&] {
    dp->reset_traffic();
    if (hybrid.replicate) {
      hybrid.shard->reset_traffic();
      hybrid.replicate->reset_traffic();
    }
    if (tensor_parallel) tensor_parallel->group()->reset_traffic();
    if (layout.cp) layout.cp->group()->reset_traffic();
  };
  Clock::time_point t0, step_start;
  std::vector<double> step_seconds;  // each timed step's
  // A step with its state on the host waits for the device by design (Note [State on the host]).
  const bool sync_errors = device.is_cuda() && !c.strategy.offload.any() &&
                           env::get("DTORCH_SYNC_ERRORS").value_or("") == "1";
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
  PhaseTimes phases(true, device);
  zero::WaitSeconds waits0;
  // Page faults of the timed steps: memory the kernel had to clear and map again (Note
  // [Returning released memory]).
  int64_t faults0 = 0;
  auto minor_faults = [] {
    struct rusage now {};
    getrusage(RUSAGE_SELF, &now);
    return static_cast<int64_t>(now.ru_minflt);
  };
  for (int step = 0; step < c.warmup_steps + c.steps; ++step) {
    const bool timed = step >= c.warmup_steps;
    if (step == c.warmup_steps) {
      synchronize(device);
      world->barrier("bench start");
      reset();
      reset_peak_memory(device);
      // The meter takes the thread's profiler slot (Note [Allocation meter]): under --profile
      // Kineto has it, and the bytes the meter counts are not reported.
      if (c.profile.empty()) meter.emplace();
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
          return cross_entropy(out, t, tensor_parallel);
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
        loss = cross_entropy(model->forward(x), y, tensor_parallel);
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
  comm::Traffic traffic = dp->traffic(), tp_traffic, cp_traffic, replica_traffic;
  if (hybrid.replicate) {
    replica_traffic = hybrid.replicate->traffic();
    traffic += hybrid.shard->traffic();
    traffic += replica_traffic;
  }
  if (tensor_parallel) tp_traffic = tensor_parallel->group()->traffic();
  if (layout.cp) cp_traffic = layout.cp->group()->traffic();
  auto m = strategy->memory();
  const DeviceMemory gpu = device_memory(device);

  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double faults_per_step = double(ru.ru_minflt - faults0) / c.steps;
  // Note [Kept large buffers]: a steady step should fault in a small share of the pages its
  // gradients span.
  const double grad_pages = double(m.grad_bytes) / double(sysconf(_SC_PAGESIZE));
  const int n = hybrid.shard ? hybrid.shard->size() : dp->size();
  // The ZeRO formulas over the ranks sharing shards, for the parameters this rank holds.
  double expected = report::model_state_bytes(zero_stage(c.strategy.kind), double(P_local), n,
                                              double(m.resident_unit_bytes));
  auto per_step = [&](const comm::Traffic& t) {
    return nlohmann::json{{"allreduce", t.allreduce / c.steps},
                          {"reduce_scatter", t.reduce_scatter / c.steps},
                          {"allgather", t.allgather / c.steps},
                          {"broadcast", t.broadcast / c.steps},
                          {"total", t.total() / c.steps},
                          // Note [Traffic across nodes]
                          {"within_node", t.within_node() / c.steps},
                          {"cross_node", t.cross_node / c.steps}};
  };
  const int64_t sent = traffic.total() + tp_traffic.total() + cp_traffic.total();
  nlohmann::json j = {
      {"impl", "dtorch"},
      {"bench", "memory"},
      {"torch", TORCH_VERSION},
      {"model", c.model},
      {"strategy", name_of(c.strategy.kind)},
      {"precision", name_of(c.strategy.precision.compute)},
      {"nproc", world->size()},
      {"dp", layout.data_ranks()},
      {"tp", c.parallelism.tp},
      {"rank", world->rank()},
      {"params", P},
      {"params_local", P_local},
      {"param_bytes", m.param_bytes},
      {"grad_bytes", m.grad_bytes},
      {"optim_bytes", m.optim_bytes},
      {"offloaded_optim_bytes", m.offloaded_optim_bytes},  // on disk, not in total()
      {"offloaded_param_bytes", m.offloaded_param_bytes},  // on disk, not in total()
      {"model_state_bytes", m.total()},
      // Where the model state lives: the device's memory (a GPU's), the host's, the disk's.
      {"model_state_by_place",
       {{"device", device.is_cuda() ? m.total() - m.host_bytes : 0},
        {"host", device.is_cuda() ? m.host_bytes : m.total()},
        {"nvme", m.offloaded_optim_bytes + m.offloaded_param_bytes}}},
      {"peak_param_bytes", m.peak_param_bytes},
      {"resident_unit_bytes", m.resident_unit_bytes},
      {"formula_bytes", expected},
      {"model_state_over_formula", m.total() / expected},
      {"peak_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024},
      {"device", device.str()},
      {"gpu", gpu_name(device)},
      {"cuda_peak_allocated_bytes", gpu.peak_allocated},
      {"cuda_peak_reserved_bytes", gpu.peak_reserved},
      {"batch_size", c.batch_size},
      {"seq_len", model->takes_tokens() ? T : 0},
      {"image_size", model->takes_tokens() ? 0 : side},
      {"samples_per_s", c.steps * c.batch_size * layout.data_ranks() / seconds},
      {"page_faults_per_step", faults_per_step},
      {"page_faults_per_grad_page", grad_pages > 0 ? faults_per_step / grad_pages : 0.0},
      {"step_seconds", seconds / c.steps},
      {"timed_step_seconds", step_seconds},
      {"step_seconds_median", median_seconds(step_seconds)},
      {"activation_checkpointing", c.parallelism.activation_checkpointing},
      {"forward_backward_peak_bytes", meter ? nlohmann::json(step_peak_bytes) : nlohmann::json()},
      {"bytes_sent_per_step", per_step(traffic)},
      {"tp_bytes_sent_per_step", per_step(tp_traffic)},
      {"cp", c.parallelism.cp},
      {"sent_per_step_over_param_bytes", double(sent) / c.steps / (4.0 * P)},
  };
  if (hybrid.replicate) {
    // Note [Hybrid sharding]: the job's bytes across nodes a step, and plain ZeRO's over the
    // same ranks by the ring's count: the shard group's passes over N ranks instead of S, all
    // sent across by the R ranks that end a node. Every rank does the same, so rank 0's
    // numbers stand for all.
    const int R = hybrid.replicate->size(), S = n, N = R * S;
    const double across = double(N) * double(traffic.cross_node) / c.steps;
    const double shard_sent = double((traffic.total() - replica_traffic.total())) / c.steps;
    const double plain = S > 1 ? R * shard_sent * (double(N - 1) / N) / (double(S - 1) / S) : 0;
    j["dp_replicate"] = R;
    j["replicate_bytes_sent_per_step"] = per_step(replica_traffic);
    j["job_cross_node_bytes_per_step"] = across;
    j["plain_zero_job_cross_node_bytes_per_step"] = plain;
    if (world->rank() == 0 && plain > 0) {
      log::info("hybrid sharding: ", static_cast<int64_t>(across),
                " bytes a step cross nodes in the job; plain ZeRO over its ", N,
                " ranks would send ", static_cast<int64_t>(plain), " (",
                std::round(plain / across * 10) / 10, "x as many)");
    }
  }
  if (layout.cp) {
    // Note [Ring attention], Note [Ulysses]: every block's attention, forward and backward
    // (and forward again for each block that recomputes it).
    const int n_cp = c.parallelism.cp;
    const int every = c.parallelism.activation_checkpointing;
    const int64_t recomputed = every > 0 ? (shape.layers + every - 1) / every : 0;
    const int64_t element = strategy->autocast().enabled ? 2 : 4;
    const int64_t heads = shape.heads / c.parallelism.tp, local = T / n_cp;
    const cp::LayerBytes layer =
        cp::bytes_sent_per_layer(c.parallelism.cp_kind, n_cp, c.batch_size, heads, local,
                                 shape.hidden / shape.heads, element);
    j["cp_kind"] = name_of(c.parallelism.cp_kind);
    j["tokens_per_rank"] = local;
    j["cp_bytes_sent_per_step"] = cp_traffic.send / c.steps;
    j["cp_formula_bytes_per_step"] =
        shape.layers * (layer.forward + layer.backward) + recomputed * layer.forward;
  }
  if (!pipeline) {
    j["forward_kept_bytes"] = meter ? nlohmann::json(forward_bytes) : nlohmann::json();
    const zero::WaitSeconds waits = strategy->comm_waits();
    const std::map<std::string, double> ms = phases.take_mean_ms(c.steps);
    auto phase = [&](const char* name) { return ms.count(name) ? ms.at(name) / 1e3 : 0.0; };
    j["phase_seconds"] = {{"forward", phase("forward")},
                          {"backward", phase("backward")},
                          {"optimizer", phase("optimizer")},
                          {"gather_wait", (waits.gather - waits0.gather) / c.steps},
                          {"reduce_wait", (waits.reduce - waits0.reduce) / c.steps}};
  }
  if (pipeline) {
    // The bubble as measured (time not spent in forward or backward, over the step) and as
    // the on-paper simulator gives it with equal F, B and W times.
    const auto sim = pp::simulate(pipeline->schedule(), c.parallelism.microbatches);
    const int pp_rank = pipeline->group().rank();
    j["pp"] = c.parallelism.pp;
    j["pp_rank"] = pp_rank;
    j["schedule"] = name_of(c.parallelism.schedule);
    j["microbatches"] = c.parallelism.microbatches;
    j["idle_fraction"] = 1.0 - compute_seconds / pipeline_seconds;
    j["simulated_idle_fraction"] = sim.idle_fraction[pp_rank];
    j["peak_activations"] = peak_activations;
    j["simulated_peak_activations"] = sim.peak_activations[pp_rank];
    nlohmann::json units = nlohmann::json::array();  // per stage this rank runs
    for (int s : layout.pp.stages)
      units.push_back({layout.pp.plan.stages[s].begin, layout.pp.plan.stages[s].end});
    j["stages_units"] = units;
  }
  return j;
}

}  // namespace dtorch::train
