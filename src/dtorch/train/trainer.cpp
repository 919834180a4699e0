// Trainer: load data, build the model and apply the strategy, then per epoch train, evaluate,
// record and checkpoint. All ranks take the same number of steps (the sampler pads) so no
// collective ever waits on a rank that ran out of data.
#include "dtorch/train/trainer.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "dtorch/checkpoint/pipeline_checkpoint.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/device.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/trace_range.h"
#include "dtorch/data/prefetch.h"
#include "dtorch/data/sampler.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/cp/sequence_chunks.h"
#include "dtorch/parallel/parallel_dims.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/report/profiler.h"
#include "dtorch/report/tensorboard.h"
#include "dtorch/train/background_save.h"
#include "dtorch/train/evaluate.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/model_file.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/preemption.h"
#include "dtorch/train/resume.h"
#include "dtorch/train/run_folder.h"
#include "dtorch/train/step.h"
#include "dtorch/train/step_stats.h"
#include "dtorch/train/strategy/strategy.h"
#include "dtorch/train/train_data.h"

namespace dtorch::train {
namespace {

// ", GPU peak 3.2 GiB allocated (4 GiB reserved), loss scale 65536 (2 steps skipped)": what
// only some runs record (EpochRecord::more); empty for the others.
std::string describe_more(const std::map<std::string, double>& more) {
  std::ostringstream os;
  os.precision(3);
  auto at = [&](const char* key) { return more.count(key) ? more.at(key) : -1.0; };
  if (at("gpu_peak_allocated_bytes") >= 0) {
    os << ", GPU peak " << at("gpu_peak_allocated_bytes") / double(1 << 30) << " GiB allocated ("
       << at("gpu_peak_reserved_bytes") / double(1 << 30) << " GiB reserved)";
  }
  if (at("loss_scale") >= 0) {
    os << ", loss scale " << at("loss_scale") << " (" << static_cast<int64_t>(at("skipped_steps"))
       << " step(s) skipped)";
  }
  return os.str();
}

// "device: cuda:0 (NVIDIA H100 80GB HBM3, 79.2 GiB)", or the CPU with a word when a GPU was
// there to use.
std::string describe_device(at::Device device, DeviceKind asked) {
  if (device.is_cuda()) {
    return str("device: ", device, " per rank (", gpu_name(device), ", ",
               device_memory(device).total / double(1 << 30), " GiB)");
  }
  const CudaAvailability cuda = cuda_availability();
  if (asked == DeviceKind::CPU && cuda.visible > 0) {
    return str("device: cpu, though ", cuda.visible,
               " GPU(s) are visible: add --device cuda to train on them");
  }
  return "device: cpu";
}

// Tokens per text window: --seq-len, or the model's longest sequence capped at 64 (a short
// default keeps CPU steps quick; gpt-debug's block is 32).
int64_t window_length(const TrainConfig& c, const models::Model& m) {
  const int64_t longest = m.max_sequence_length();
  const int64_t T = c.model.seq_len == 0 ? std::min<int64_t>(64, longest) : c.model.seq_len;
  DTORCH_CHECK_T(ConfigError, T <= longest, "--seq-len ", T, " is longer than ", c.model.name,
                 "'s block size ", longest, "; use --seq-len ", longest, " or less");
  cp::check_sequence_length(T, c.parallelism.cp);
  return T;
}

// What the run is, in the log: the model, data and job, recomputation, the mesh and the pipeline's
// stages, the strategy.
void log_run(const TrainConfig& c, const TrainData& data, int world, const Parallelized& run) {
  const models::Model* model = run.model.get();
  const Layout& layout = run.layout;
  const bool tensor_parallel = layout.tp.handle != nullptr;
  const bool pipeline = layout.pp.pipeline != nullptr;
  log::info("training ", c.model.name, " on ", data.describe, ", ", world, " rank(s) x batch ",
            c.training.batch_size, ", ", c.training.epochs, " epoch(s), ",
            name_of(c.strategy.optimizer.kind), " lr ", c.strategy.optimizer.lr, ", seed ",
            c.training.seed, ", ", torch::get_num_threads(), " thread(s) per rank -> ",
            c.checkpointing.out,
            c.checkpointing.async_save ? " (checkpoints written in the background)" : "");
  if (c.parallelism.activation_checkpointing > 0) {
    const size_t blocks = model->block_names().size();
    log::info("activation checkpointing: ",
              (blocks + c.parallelism.activation_checkpointing - 1) /
                  c.parallelism.activation_checkpointing,
              " of ", blocks, " block(s)", pipeline ? " of this stage" : "",
              " recompute their forward in backward");
  }
  if ((tensor_parallel || layout.cp || layout.hybrid.replicate) && !pipeline) {
    log::info(
        "mesh: ", parallel::describe(layout.plan),
        c.parallelism.sequence_parallel ? " (sequence parallel)" : "",
        layout.cp
            ? str(" (context parallel: ", name_of(c.parallelism.cp_kind), " attention, ",
                  layout.cp->local_length(model->takes_tokens() ? window_length(c, *model) : 0),
                  " tokens per rank)")
            : std::string());
  }
  if (pipeline) {
    std::vector<std::string> names = model->unit_names();
    log::info("mesh: ", parallel::describe(layout.plan),
              c.parallelism.sequence_parallel ? " (sequence parallel)" : "", ", schedule ",
              name_of(c.parallelism.schedule), ", ", c.parallelism.microbatches,
              " micro-batches per batch");
    std::istringstream stages(pp::describe(layout.pp.plan, names));
    for (std::string line; std::getline(stages, line);)
      log::info(line);
  }
  log::info("strategy: ", run.strategy->describe());
}

// The parts of a run its epochs use, and the optimizer steps taken so far.
struct Epochs {
  const TrainConfig& c;
  comm::Communicator& world;
  Parallelized& run;
  TrainData& data;
  data::DistributedSampler& sampler;
  at::Device device;
  Schedule schedule;
  int64_t total_steps = 0;
  int64_t global_step = 0;
  bool lead = false;
  // Made after the rest (hence initialized here: the braces that make an Epochs stop above).
  std::unique_ptr<report::MetricsWriter> metrics{};    // rank 0's
  std::unique_ptr<report::TensorBoardWriter> board{};  // rank 0's, with --tensorboard
  std::unique_ptr<report::ProgressReporter> progress{};
  std::unique_ptr<PhaseTimes> epoch_phases{};
  std::unique_ptr<DeviceCopier> copier{};            // Note [Batches to the GPU]
  std::unique_ptr<BackgroundSaver> saver{};          // --async-checkpoint
  std::unique_ptr<report::StepProfiler> profiler{};  // --profile
  std::unique_ptr<Preemption> preemption{};          // Note [Checkpoint on a signal]
  // Where the job stops after the signal: the epoch's batches done then.
  std::optional<int64_t> stopped_after_batches{};

  // The rate of the last optimizer step taken.
  double last_lr() const {
    return schedule.at(std::max<int64_t>(0, global_step - run.strategy->skipped_steps() - 1));
  }
};

// What rank 0 shows: a bar while stepping, or plain lines when --print-every prints its own.
report::ProgressConfig progress_config(const TrainConfig& c, bool lead) {
  if (!lead) return report::ProgressConfig{report::ProgressConfig::Mode::Off};
  report::ProgressConfig shown = c.reporting.progress;
  if (c.reporting.print_every > 0 && shown.mode == report::ProgressConfig::Mode::Auto) {
    // The step lines report the progress; a redrawn bar would break them up.
    shown.mode = report::ProgressConfig::Mode::Lines;
    shown.every_steps = 0;
    shown.every_seconds = 0;
  }
  return shown;
}

// A loss that is not finite reaches every parameter at the next reduction, and every later
// loss is NaN: stop where it is seen (`where`: the step on the CPU, the steps read together on a
// GPU, Note [No host sync in a step]). fp16's dynamic loss scaling skips such steps itself (Note
// [Loss scaling]).
void check_loss(const Epochs& e, double loss, const std::string& where) {
  DTORCH_CHECK_T(TrainingError,
                 std::isfinite(loss) || e.c.strategy.precision.compute == Precision::FP16,
                 "the loss is ", loss, " on rank ", e.world.rank(), " ", where,
                 ": the model diverged or a batch holds NaN. Lower --lr, "
                 "add --clip-grad-norm 1.0, or train in --precision fp32; --resume continues "
                 "from the last checkpoint");
}

// --print-every's log line and "step" record over the window's `steps` optimizer steps.
void report_window(Epochs& e, int64_t epoch, const LossTally& window, int64_t steps,
                   PhaseTimes& phases, double seconds) {
  const auto ms = phases.take_mean_ms(steps);
  const double rate = static_cast<double>(window.samples) / seconds;
  const double lr = e.last_lr();
  const double loss = window.mean();
  check_loss(e, loss, str("in steps ", e.global_step - steps + 1, " to ", e.global_step));
  if (!e.lead) return;
  log::info("step ", e.global_step, "/", e.total_steps, ": loss ", loss, ", lr ", lr, ", ",
            static_cast<int64_t>(rate), " samples/s", describe_phases(ms));
  std::map<std::string, double> record{{"step", static_cast<double>(e.global_step)},
                                       {"epoch", static_cast<double>(epoch)},
                                       {"train_loss", loss},
                                       {"lr", lr},
                                       {"samples_per_s", rate}};
  for (const auto& [phase, v] : ms)
    record[phase + "_ms"] = v;
  if (e.c.strategy.precision.compute == Precision::FP16) {
    record["loss_scale"] = e.run.strategy->loss_scale();
    record["skipped_steps"] = static_cast<double>(e.run.strategy->skipped_steps());
  }
  e.metrics->write("step", record);
}

// One epoch's steps: every rank takes the same number (the sampler pads). Returns the loss of
// its batches over all ranks' samples. `from`: a checkpoint's progress inside the epoch, whose
// batches are skipped. Stops early, setting e.stopped_after_batches, after the step every rank
// agreed to stop
// after (Note [Checkpoint on a signal]).
LossTally train_epoch(Epochs& e, int64_t epoch, const EpochProgress& from) {
  const TrainConfig& c = e.c;
  models::Model& model = *e.run.model;
  Strategy& strategy = *e.run.strategy;
  pp::Pipeline* pipeline = e.run.layout.pp.pipeline.get();
  const Layout& layout = e.run.layout;
  const int64_t dp_size = layout.data_ranks();
  e.sampler.set_epoch(epoch);
  auto batches = data::make_batches(e.sampler.indices(), c.training.batch_size);
  const size_t first =
      static_cast<size_t>(std::min<int64_t>(from.batches, static_cast<int64_t>(batches.size())));
  const bool to_gpu = e.device.is_cuda();
  data::Prefetcher loader(static_cast<int64_t>(batches.size() - first), c.data.loader.workers,
                          [&, epoch, to_gpu, first](int64_t k) {
                            auto [x, y] = e.data.train.batch(batches[first + k], epoch);
                            if (!to_gpu) return std::make_pair(x, y);
                            auto both = pinned({x, y});
                            return std::make_pair(both[0], both[1]);
                          });
  if (first < batches.size()) {
    auto [x, y] = loader.next();
    e.copier->start({x, y});
  }
  e.progress->start_epoch(epoch, c.training.epochs, static_cast<int64_t>(batches.size()));
  model.train();
  LossTally epoch_tally = from.tally;
  // The window a --print-every line reports on: the steps since the last line this epoch.
  PhaseTimes window_phases(c.reporting.phase_times, e.device);
  LossTally window;
  int64_t window_steps = 0;
  LossTally step_tally;  // the batches of this optimizer step, for TensorBoard
  auto window_start = Clock::now();
  for (size_t i = first; i < batches.size(); ++i) {
    e.epoch_phases->start();
    window_phases.start();
    const std::vector<torch::Tensor> batch = e.copier->ready();
    const torch::Tensor &x = batch[0], &y = batch[1];
    if (i + 1 < batches.size()) {
      auto [next_x, next_y] = loader.next();
      e.copier->start({next_x, next_y});
    }
    const std::function<void(const char*)> lap = [&](const char* phase) {
      e.epoch_phases->lap(phase);
      window_phases.lap(phase);
    };
    lap("data");
    if (e.profiler) e.profiler->before_step(e.global_step + 1);
    // A step fp16 skipped does not advance the schedule (Note [Loss scaling]). Set just before
    // the optimizer step: the last step's outcome is known by then without draining a GPU.
    const auto set_lr = [&] {
      strategy.set_lr(e.schedule.at(e.global_step - strategy.skipped_steps()));
    };
    const bool last_micro = (i + 1) % c.training.accum_steps == 0 || i + 1 == batches.size();
    StepOptions step_options;
    step_options.clip_grad_norm = c.training.clip_grad_norm;
    step_options.accum_steps = c.training.accum_steps;
    step_options.update = last_micro;
    step_options.lap = lap;
    step_options.before_update = set_lr;
    // The batch's loss, left where it was computed (Note [No host sync in a step]).
    const torch::Tensor batch_loss = step(e.run, x, y, step_options);
    const bool stepped = last_micro || pipeline;  // a pipeline updates every batch
    if (batch_loss.is_cpu()) {
      check_loss(e, batch_loss.item<double>(),
                 str("at step ", e.global_step + 1, " (epoch ", epoch, ", batch ", i + 1, ")"));
    }
    const int64_t batch_samples = x.size(0) * dp_size;
    step_tally.add(batch_loss, batch_samples);
    epoch_tally.add(batch_loss, batch_samples);
    window.add(batch_loss, batch_samples);
    if (stepped) {
      ++e.global_step;
      ++window_steps;
      if (e.profiler) e.profiler->after_step(e.global_step);
      if (e.saver) e.saver->poll();
      if (e.board) {
        e.board->scalar("train/loss", e.global_step, step_tally.mean());
        e.board->scalar("train/lr", e.global_step, e.last_lr());
      }
      step_tally = {};
    }
    e.progress->update(
        static_cast<int64_t>(i) + 1, [batch_loss] { return batch_loss.item<double>(); },
        epoch_tally.samples);
    if (stepped && c.reporting.print_every > 0 && e.global_step % c.reporting.print_every == 0) {
      report_window(e, epoch, window, window_steps, window_phases, seconds_since(window_start));
      window = {};
      window_steps = 0;
      window_start = Clock::now();
    }
    if (stepped && e.preemption && e.preemption->stop_after(e.global_step)) {
      e.stopped_after_batches = static_cast<int64_t>(i) + 1;
      break;
    }
  }
  return epoch_tally;
}

// The epoch's record, from its training (`tally`, `train_seconds`, the optimizer steps since
// `first_step`, the samples the tally had before them, from a checkpoint inside the epoch) and
// the evaluation it runs now; logged and written on rank 0.
report::EpochRecord finish_epoch(Epochs& e, int64_t epoch, const LossTally& tally,
                                 Clock::time_point t0, double train_seconds, int64_t first_step,
                                 int64_t samples_before) {
  const Layout& layout = e.run.layout;
  Strategy& strategy = *e.run.strategy;
  const double own_loss = tally.mean();
  check_loss(e, own_loss,
             str("in epoch ", epoch, "'s steps ", first_step + 1, " to ", e.global_step));
  auto mean_loss = torch::tensor({own_loss}, torch::kDouble);
  e.world.allreduce(mean_loss, comm::ReduceOp::Avg, "epoch train loss");
  auto [test_loss, test_acc] =
      evaluate(*e.run.model, e.data.test, e.c.data.test_samples, strategy, layout, e.world);
  report::EpochRecord r;
  r.epoch = epoch;
  r.step = e.global_step;
  r.train_loss = mean_loss.item<double>();
  r.test_loss = test_loss;
  r.test_accuracy = test_acc;
  r.samples_per_s = static_cast<double>(tally.samples - samples_before) / train_seconds;
  r.seconds = seconds_since(t0);
  r.lr = e.last_lr();
  r.phase_ms = e.epoch_phases->take_mean_ms(e.global_step - first_step);
  if (e.device.is_cuda()) {
    const DeviceMemory m = device_memory(e.device);
    r.more["gpu_peak_allocated_bytes"] = static_cast<double>(m.peak_allocated);
    r.more["gpu_peak_reserved_bytes"] = static_cast<double>(m.peak_reserved);
  }
  if (e.c.strategy.precision.compute == Precision::FP16) {
    r.more["loss_scale"] = strategy.loss_scale();
    r.more["skipped_steps"] = static_cast<double>(strategy.skipped_steps());
  }
  if (!e.lead) return r;
  log::info("epoch ", epoch + 1, "/", e.c.training.epochs, ": train loss ", r.train_loss,
            ", test loss ", r.test_loss, ", test accuracy ", 100.0 * r.test_accuracy, "%, ",
            static_cast<int64_t>(r.samples_per_s), " samples/s, ", r.seconds, " s",
            describe_phases(r.phase_ms), describe_more(r.more));
  e.metrics->write_epoch(r);
  if (e.board) {
    e.board->scalar("epoch/train_loss", e.global_step, r.train_loss);
    e.board->scalar("epoch/test_loss", e.global_step, r.test_loss);
    e.board->scalar("epoch/test_accuracy", e.global_step, r.test_accuracy);
    e.board->scalar("epoch/samples_per_s", e.global_step, r.samples_per_s);
    e.board->scalar("epoch/lr", e.global_step, r.lr);
    for (const auto& [phase, ms] : r.phase_ms)
      e.board->scalar("epoch/" + phase + "_ms", e.global_step, ms);
  }
  return r;
}

// The optimizer's state is made at the first step, or when a checkpoint loads: when the ranks
// of this node could not hold it, the out-of-memory report now, not the kernel's OOM killer then,
// which leaves no message (Note [Out of memory]). The model's own memory is already held.
void check_state_fits(const Parallelized& run, int local_ranks,
                      const report::MemoryContext& memory) {
  if (!memory.device.is_cpu() || memory.optimizer_on_disk) return;
  int64_t mine = 0;  // the parameters this rank's model holds (its tp shard, its stage)
  for (const auto& p : run.model->parameters())
    mine += p.numel();
  const double per_rank =
      memory.optimizer_bytes * double(mine) / (memory.zero_stage > 0 ? memory.ranks : 1);
  const std::string says =
      report::state_to_come_message(per_rank, local_ranks, memory, report::process_memory());
  if (!says.empty()) throw OutOfMemoryError(says);
}

// The run; `memory` learns what it trains as it goes, for the message should memory run out.
std::vector<report::EpochRecord> train_run(const TrainConfig& c,
                                           std::shared_ptr<comm::Communicator> comm,
                                           report::MemoryContext& memory) {
  if (c.training.threads > 0) torch::set_num_threads(c.training.threads);
  const bool lead = comm->rank() == 0;
  const at::Device device = resolve_run_device(c.strategy.device, comm->info());
  memory.device = device;
  memory.state_on_host = !device.is_cpu() && c.strategy.offload.any();
  if (lead) log::info(describe_device(device, c.strategy.device));
  if (!c.reporting.profile.empty()) report::require_profiler();  // before any work
  // Note [One run per folder]: before anything is written or read there.
  const bool continues = continues_run(c, comm->info());
  check_run_folder(c, continues);
  if (lead) prepare_run_folder(c, continues);
  // Image data first: the model is built for its channels, size and classes.
  TrainData data = open_data(c.data, c.training.seed);
  torch::manual_seed(c.training.seed);
  // The model spread over the job (Note [Assembly order]).
  ParallelizeSpec spec;
  spec.model = c.model.name;
  spec.input = data.input;
  spec.parallelism = c.parallelism;
  spec.strategy = c.strategy;
  spec.device = device;
  Parallelized run = parallelize(spec, comm, [&](const models::Model& m) {
    for (const auto& p : m.parameters())
      memory.parameters += p.numel();
  });
  const std::shared_ptr<comm::Communicator>& dp = run.layout.dp;
  memory.ranks = dp->size();
  if (run.model->takes_tokens())
    add_text_windows(data, c.data.source, window_length(c, *run.model));
  if (lead) log_run(c, data, comm->size(), run);
  const int64_t n_train =
      c.data.train_samples > 0 ? std::min(c.data.train_samples, data.train.size) : data.train.size;
  data::DistributedSampler sampler(n_train, run.layout.data_rank(), run.layout.data_ranks(),
                                   c.training.seed);
  // Every epoch has the same number of batches (the sampler pads), hence of optimizer steps.
  const int64_t batches_per_epoch =
      data::num_batches(sampler.samples_per_rank(), c.training.batch_size);
  const int64_t steps_per_epoch =
      (batches_per_epoch + c.training.accum_steps - 1) / c.training.accum_steps;
  Schedule own_schedule{c.training.lr_schedule, c.strategy.optimizer.lr,
                        steps_per_epoch * c.training.epochs};
  validate(own_schedule.config, own_schedule.lr, own_schedule.total_steps);
  check_state_fits(run, comm->info().local_world_size, memory);  // before a checkpoint loads
  const StartPoint start = resume_run(c, *run.strategy, *comm, own_schedule, lead);

  Epochs e{c,
           *comm,
           run,
           data,
           sampler,
           device,
           start.schedule,
           steps_per_epoch * c.training.epochs,
           start.global_step,
           lead};
  if (lead) {
    log::info("optimizer ", name_of(c.strategy.optimizer.kind), ", learning rate ",
              describe(e.schedule.config, e.schedule.lr, e.schedule.total_steps), ", ",
              steps_per_epoch, " step(s) per epoch");
    // What this run is, once its checkpoint is loaded, and the job's size: `dtorch train
    // --config` reruns it (Note [The job's size in config.json]).
    write_config_file(c, job_size_of(comm->size(), comm->info().local_world_size),
                      paths::join(c.checkpointing.out, "config.json"));
    const std::string metrics = c.checkpointing.out + "/metrics.jsonl";
    if (start.resumed) report::keep_records_through(metrics, start.global_step);
    e.metrics = std::make_unique<report::MetricsWriter>(metrics, start.resumed);
    if (!c.reporting.tensorboard.empty()) {
      e.board = std::make_unique<report::TensorBoardWriter>(c.reporting.tensorboard);
      log::info("TensorBoard events: ", e.board->path());
    }
  }
  e.progress = std::make_unique<report::ProgressReporter>(progress_config(c, lead));
  e.epoch_phases = std::make_unique<PhaseTimes>(c.reporting.phase_times, device);
  e.copier = std::make_unique<DeviceCopier>(device);
  if (c.checkpointing.async_save) e.saver = std::make_unique<BackgroundSaver>(*run.strategy);
  const report::StepRange profiled = report::parse_step_range(c.reporting.profile, "--profile");
  DTORCH_CHECK_T(ConfigError, profiled.last <= e.total_steps, "--profile ", c.reporting.profile,
                 " ends after the run's last optimizer step (", e.total_steps,
                 "); trace steps within it, or train longer");
  if (!profiled.empty()) {
    e.profiler = std::make_unique<report::StepProfiler>(
        profiled, report::trace_path(c.checkpointing.out, comm->rank()), device);
  }
  e.preemption =
      std::make_unique<Preemption>(c.checkpointing.checkpoint_signal, comm->store(), comm->rank());
  // A checkpoint after the epoch's `epochs_done` or inside the next (`within`, Note [Checkpoint
  // on a signal]), named after the epoch either way.
  const auto save = [&](int64_t epochs_done, const EpochProgress& within) {
    std::string metadata = config_json(c, comm->size(), e.schedule, data.input);
    if (within.batches > 0) metadata = with_epoch_progress(metadata, within);
    const checkpoint::CheckpointData saved{epochs_done + (within.batches > 0 ? 1 : 0),
                                           e.global_step, metadata};
    if (e.saver)
      e.saver->save(c.checkpointing.out, saved, c.checkpointing.keep);
    else
      run.strategy->save(c.checkpointing.out, saved, c.checkpointing.keep);
    if (lead && !run.layout.pp.pipeline)
      checkpoint::forget_pipeline_layout(c.checkpointing.out);  // the stage folders are older now
    if (lead && !e.saver) forget_overwritten_run(c.checkpointing.out);
  };
  // After the checkpoint on the signal: the last save written, then out (`dtorch train` exits 75).
  const auto stop = [&] {
    if (e.saver) e.saver->finish();
    if (lead)
      log::info("checkpointed after step ", e.global_step, " in ", c.checkpointing.out,
                "; stopping");
    throw CheckpointedOnSignal{e.global_step};
  };
  std::vector<report::EpochRecord> records;
  for (int64_t epoch = start.epoch; epoch < c.training.epochs; ++epoch) {
    const auto t0 = Clock::now();
    const int64_t first_step = e.global_step;
    reset_peak_memory(device);
    const EpochProgress from = epoch == start.epoch ? start.within : EpochProgress{};
    const LossTally tally = train_epoch(e, epoch, from);
    const double train_seconds = seconds_since(t0);
    e.progress->finish_epoch();
    if (e.stopped_after_batches && *e.stopped_after_batches < batches_per_epoch) {
      // Every rank resumes with the ranks' mean loss so far, which finish_epoch's mean of the
      // ranks' means then extends as if the run had not stopped.
      auto so_far = torch::tensor({tally.sum()}, torch::kDouble);
      e.world.allreduce(so_far, comm::ReduceOp::Avg, "the epoch's loss so far");
      save(epoch, {*e.stopped_after_batches,
                   LossTally::resumed(so_far.item<double>(), tally.batches, tally.samples)});
      stop();
    }
    records.push_back(
        finish_epoch(e, epoch, tally, t0, train_seconds, first_step, from.tally.samples));
    save(epoch + 1, {});
    if (e.stopped_after_batches && epoch + 1 < c.training.epochs)
      stop();  // else the run is done anyway
  }
  if (e.saver) e.saver->finish();
  if (lead) forget_overwritten_run(c.checkpointing.out);
  write_model_file(c, run, *comm);
  return records;
}

}  // namespace

std::vector<report::EpochRecord> train(const TrainConfig& config,
                                       std::shared_ptr<comm::Communicator> comm) {
  TrainConfig c = config;
  ConfigSources sources;
  sources.world_size = comm->size();
  resolve(c, sources);
  report::MemoryContext memory;
  memory.rank = comm->rank();
  memory.ranks = comm->size();
  memory.model = c.model.name;
  memory.zero_stage = zero_stage(c.strategy.kind);
  memory.optimizer = name_of(c.strategy.optimizer.kind);
  memory.optimizer_bytes = c.strategy.optimizer.kind == OptimizerKind::SGD ? 4 : 8;
  memory.batch_size = c.training.batch_size;
  memory.activation_checkpointing = c.parallelism.activation_checkpointing > 0;
  memory.optimizer_on_disk = c.strategy.offload.optimizer == OffloadDevice::NVMe;
  memory.params_on_disk = c.strategy.offload.params == OffloadDevice::NVMe;
  try {
    return train_run(c, std::move(comm), memory);
  } catch (const OutOfMemoryError&) {
    throw;  // reported already
  } catch (const std::exception& e) {
    if (!report::is_out_of_memory(e)) throw;
    // Note [Out of memory]
    throw OutOfMemoryError(report::out_of_memory_message(e.what(), memory, report::process_memory(),
                                                         device_memory(memory.device)));
  }
}

}  // namespace dtorch::train
