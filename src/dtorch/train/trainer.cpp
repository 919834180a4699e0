// Trainer: load data, build the model and apply the strategy, then per epoch train, evaluate,
// record and checkpoint. All ranks take the same number of steps (the sampler pads) so no
// collective ever waits on a rank that ran out of data.
#include "dtorch/train/trainer.h"

#include <nlohmann/json.hpp>

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
#include "dtorch/data/prefetch.h"
#include "dtorch/data/sampler.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/autocast.h"
#include "dtorch/parallel/parallel_dims.h"
#include "dtorch/parallel/tp/tensor_parallel.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/report/tensorboard.h"
#include "dtorch/train/loss.h"
#include "dtorch/train/parallelize.h"
#include "dtorch/train/strategy.h"
#include "dtorch/train/train_data.h"

namespace dtorch::train {
namespace {

// The training loss over some batches (a step, a --print-every window, an epoch): its mean
// per batch, and the samples all ranks saw.
struct LossTally {
  double loss = 0;
  int64_t batches = 0;
  int64_t samples = 0;
  void add(double batch_loss, int64_t batch_samples) {
    loss += batch_loss;
    ++batches;
    samples += batch_samples;
  }
  double mean() const { return loss / static_cast<double>(std::max<int64_t>(1, batches)); }
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Time per phase of the training step (--phase-times, DeepSpeed's wall_clock_breakdown),
// summed over a window of optimizer steps: lap(phase) charges the time since the previous lap.
// On a GPU the laps are CUDA events on the compute stream, so a phase is the device's time for
// its kernels, not the host's time to queue them; they are read when the window closes (or
// once they have passed, every few hundred laps), never in the middle of a step.
class PhaseTimes {
 public:
  PhaseTimes(bool on, at::Device device) : on_(on), clock_(device) {}
  void start() {
    if (on_) mark_ = clock_.mark();
  }
  void lap(const char* phase) {
    if (!on_) return;
    const int64_t now = clock_.mark();
    laps_.push_back({phase, mark_, now});
    mark_ = now;
    if (laps_.size() >= 256) settle();
  }
  // Mean milliseconds per optimizer step over `steps`, and a fresh window.
  std::map<std::string, double> take_mean_ms(int64_t steps) {
    settle();
    std::map<std::string, double> ms;
    for (const auto& [phase, s] : seconds_)
      ms[phase] = 1e3 * s / static_cast<double>(std::max<int64_t>(1, steps));
    seconds_.clear();
    return ms;
  }

 private:
  struct Lap {
    const char* phase;
    int64_t from, to;
  };
  // Adds up the laps so far (waiting for the device to reach the last) and forgets their marks.
  void settle() {
    for (const Lap& l : laps_)
      seconds_[l.phase] += clock_.seconds(l.from, l.to);
    laps_.clear();
    clock_.forget_before(mark_);
  }
  bool on_;
  DeviceClock clock_;
  int64_t mark_ = 0;
  std::vector<Lap> laps_;
  std::map<std::string, double> seconds_;
};

// ", data 0.1 ms, forward 12.1 ms, backward 30.4 ms, step 6 ms", in the order a step runs
// them (empty without phase times).
std::string describe_phases(const std::map<std::string, double>& ms) {
  std::ostringstream os;
  os.precision(3);
  for (const char* phase : report::kStepPhases)
    if (auto it = ms.find(phase); it != ms.end()) os << ", " << phase << " " << it->second << " ms";
  return os.str();
}

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
std::string describe_device(at::Device device, const std::string& asked) {
  if (device.is_cuda()) {
    return str("device: ", device, " per rank (", gpu_name(device), ", ",
               device_memory(device).total / double(1 << 30), " GiB)");
  }
  const CudaAvailability cuda = cuda_availability();
  if (asked == "cpu" && cuda.visible > 0) {
    return str("device: cpu, though ", cuda.visible,
               " GPU(s) are visible: add --device cuda to train on them");
  }
  return "device: cpu";
}

// The learning-rate schedule of a run: the configuration, the peak rate and the run's length
// fix every step's rate (Note [Learning-rate schedules]); checkpoints keep all three.
struct Schedule {
  LrScheduleConfig config;
  double lr = 0;
  int64_t total_steps = 0;

  double at(int64_t step) const { return lr_at(config, lr, step, total_steps); }
  nlohmann::json to_json() const {
    nlohmann::json j = config;
    j["lr"] = lr;
    j["total_steps"] = total_steps;
    return j;
  }
  bool operator==(const Schedule& o) const { return to_json() == o.to_json(); }
};

// The schedule a checkpoint's metadata recorded; nullopt for checkpoints written before
// schedules were recorded (they trained at a constant rate).
std::optional<Schedule> schedule_of(const std::string& metadata_json, const std::string& path) {
  auto meta = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!meta.is_object() || !meta.contains("lr_schedule")) return std::nullopt;
  try {
    const auto& j = meta.at("lr_schedule");
    Schedule s;
    j.get_to(s.config);
    s.lr = j.at("lr").get<double>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    validate(s.config, s.lr, s.total_steps);
    return s;
  } catch (const std::exception& e) {
    DTORCH_FAIL(CheckpointError, "the learning-rate schedule recorded in ", path,
                " is unreadable (", e.what(), "); resume from another checkpoint, or start a new ",
                "run in another --out");
  }
}

// A checkpoint's metadata: the run configuration as config.json holds it (Note [One list of
// settings]), and what the run derived: the job's size, the image input the model was built
// for, the learning-rate schedule's state. "model" is repeated at the top for readers that
// know nothing else of dtorch (`dtorch checkpoint`, a Python script).
std::string config_json(const TrainConfig& c, int world, const Schedule& schedule,
                        const models::ImageInput& input) {
  nlohmann::json j = {
      {"model", c.model},
      {"config", to_json(c)},
      {"input", {{"channels", input.channels}, {"size", input.size}, {"classes", input.classes}}},
      {"world_size", world},
      {"lr_schedule", schedule.to_json()}};
  return j.dump();
}

// Tokens per text window: --seq-len, or the model's longest sequence capped at 64 (a short
// default keeps CPU steps quick; gpt-debug's block is 32).
int64_t window_length(const TrainConfig& c, const models::Model& m) {
  const int64_t longest = m.max_sequence_length();
  if (c.seq_len == 0) return std::min<int64_t>(64, longest);
  DTORCH_CHECK_T(ConfigError, c.seq_len <= longest, "--seq-len ", c.seq_len, " is longer than ",
                 c.model, "'s block size ", longest, "; use --seq-len ", longest, " or less");
  return c.seq_len;
}

// Sum of loss and correct predictions over this replica's disjoint part of the test split,
// added up across the data-parallel ranks `comm` (tensor-parallel ranks share a part; under a
// pipeline only the last stage counts and the totals are added up over `world`): every test
// sample (every target token) counts exactly once.
std::pair<double, double> evaluate(models::Model& model, const Split& test, int64_t limit,
                                   Strategy& strategy, comm::Communicator& comm,
                                   comm::Communicator& world, const tp::TensorParallel* tp,
                                   pp::Pipeline* pipeline) {
  torch::NoGradGuard no_grad;
  auto whole = strategy.whole_parameters();  // ranks may run different numbers of batches
  model.eval();
  int64_t n = limit > 0 ? std::min(limit, test.size) : test.size;
  auto shard = data::eval_shard(n, comm.rank(), comm.size());
  auto sums = torch::zeros({3}, torch::kDouble);  // loss, correct, count (in host memory)
  const int64_t step = model.takes_tokens() ? 16 : 1000;
  for (int64_t b = shard.begin; b < shard.end; b += step) {
    int64_t e = std::min(shard.end, b + step);
    std::vector<int64_t> idx(e - b);
    std::iota(idx.begin(), idx.end(), b);
    auto [x, y] = test.batch(idx, 0);
    x = x.to(strategy.device());
    y = y.to(strategy.device());
    if (pipeline) {
      parallel::Autocast autocast(strategy.autocast());
      pipeline->forward_only(x, y, [&](const torch::Tensor& out, const torch::Tensor& t) {
        double loss = 0, correct = 0;
        if (tp && tp->vocab_parallel_output()) {  // collective over tp: every tp rank runs it
          loss = tp->vocab_cross_entropy(out, t).item<double>() * static_cast<double>(t.numel());
          correct = static_cast<double>(tp->vocab_correct(out, t));
        } else {
          loss = cross_entropy(out, t, at::Reduction::Sum).item<double>();
          correct = out.argmax(-1).eq(t).sum().item<double>();
        }
        if (tp && tp->group()->rank() != 0) return;  // one tp rank counts
        sums[0] += loss;
        sums[1] += correct;
        sums[2] += static_cast<double>(t.numel());
      });
      continue;
    }
    torch::Tensor out;
    {
      parallel::Autocast autocast(strategy.autocast());
      out = model.forward(x);
    }
    if (tp && tp->vocab_parallel_output()) {
      sums[0] += tp->vocab_cross_entropy(out, y).item<double>() * static_cast<double>(y.numel());
      sums[1] += static_cast<double>(tp->vocab_correct(out, y));
    } else {
      sums[0] += cross_entropy(out, y, at::Reduction::Sum).item<double>();
      sums[1] += out.argmax(-1).eq(y).sum().item<double>();
    }
    sums[2] += static_cast<double>(y.numel());
  }
  (pipeline ? world : comm).allreduce(sums, comm::ReduceOp::Sum, "evaluation totals");
  model.train();
  double count = std::max(1.0, sums[2].item<double>());
  return {sums[0].item<double>() / count, sums[1].item<double>() / count};
}

// ZeRO-1/2 under --tp N write their shards per tp index (Note [Tensor-parallel checkpoints]
// in strategy.cpp) and resume only as ZeRO at the same N: checked here, so that another layout
// never starts silently from scratch. DDP's tensor-parallel checkpoints are whole and fit any
// --tp.
// One step of the pipeline (Note [Pipeline execution]) under the strategy: every micro-batch's
// backward accumulates, then the strategy reduces over the dp group once; the clip norm
// spans all stages. Returns the batch's loss, which the last stage computed, on every rank.
double pipeline_step(pp::Pipeline& pipeline, Strategy& strategy, const torch::Tensor& x,
                     const torch::Tensor& y, double clip_grad_norm,
                     const tp::TensorParallel* tensor_parallel,
                     const std::function<void(const char*)>& lap) {
  pp::PipelineStepResult r;
  // The pipeline runs backward itself, so the loss it differentiates carries fp16's scale.
  const double scale = strategy.loss_scale();
  strategy.backward_accumulated([&] {
    parallel::Autocast autocast(strategy.autocast());
    r = pipeline.step(x, y, [&](const torch::Tensor& out, const torch::Tensor& t) {
      return cross_entropy(out, t, tensor_parallel) * scale;
    });
  });
  r.loss /= scale;
  lap("forward_backward");
  strategy.step(clip_grad_norm);  // the norm spans every stage
  lap("step");
  auto loss = torch::tensor({r.has_loss ? r.loss : 0.0}, torch::kDouble);
  pipeline.group().allreduce(loss, comm::ReduceOp::Sum, "pipeline loss");
  return loss.item<double>();
}

// The whole model's state on pp rank 0 from every stage's `stage` state of this pipeline (a
// parameter two stages hold, the tied embedding, taken once). Collective over the pp group.
checkpoint::StateDict join_pipeline_stages(pp::Pipeline& pipeline,
                                           const checkpoint::StateDict& stage) {
  comm::Communicator& g = pipeline.group();
  const std::vector<char> bytes = checkpoint::pickle_state_dict(stage);
  const std::string mine(bytes.begin(), bytes.end());
  checkpoint::StateDict full;
  std::set<std::string> seen;
  for (int r = 0; r < g.size(); ++r) {
    const std::string got =
        g.broadcast_string(r == g.rank() ? mine : std::string(), r, "pipeline stage state");
    if (g.rank() != 0) continue;
    for (auto& [name, t] : checkpoint::unpickle_state_dict(
             std::vector<char>(got.begin(), got.end()), str("stage ", r)))
      if (seen.insert(name).second) full.emplace_back(name, t);
  }
  return full;
}

void check_tensor_parallel_layout(const TrainConfig& c) {
  int saved_tp = 1;
  std::error_code ec;
  // In the run's folder, or in its pipeline stage folders (Note [Pipeline checkpoints]).
  std::vector<std::string> folders{c.out};
  for (const std::string& name : paths::list_directory(c.out, ec))
    if (name.rfind("pp", 0) == 0) folders.push_back(paths::join(c.out, name));
  for (const auto& folder : folders) {
    for (const std::string& name : paths::list_directory(folder, ec)) {
      auto of = name.find("-of-");
      if (name.rfind("tp", 0) == 0 && of != std::string::npos) {
        saved_tp = std::atoi(name.c_str() + of + 4);
      }
    }
  }
  if (saved_tp == 1) return;  // no per-tp folders: no tensor parallelism, or ddp's whole files
  DTORCH_CHECK_T(CheckpointError, saved_tp == c.tp && c.strategy.kind != "ddp",
                 "the ZeRO checkpoints in ", c.out, " were written with --tp ", saved_tp,
                 " and this run has --tp ", c.tp, " (", c.strategy.kind,
                 "): resume with --strategy zero1 or zero2 and --tp ", saved_tp,
                 " (only ddp's tensor-parallel checkpoints fit any --tp)");
}

}  // namespace

namespace {

// The run; `memory` learns what it trains as it goes, for the message should memory run out.
std::vector<report::EpochRecord> train_run(const TrainConfig& c,
                                           std::shared_ptr<comm::Communicator> comm,
                                           report::MemoryContext& memory) {
  if (c.threads > 0) torch::set_num_threads(c.threads);
  const bool lead = comm->rank() == 0;
  const int world = comm->size();
  const at::Device device = resolve_run_device(c.strategy.device, comm->info());
  memory.device = device;
  if (lead) log::info(describe_device(device, c.strategy.device));
  // What this run is, before it starts: `dtorch train --config` reruns it.
  if (lead) write_config_file(c, paths::join(c.out, "config.json"));
  // Image data first: the model is built for its channels, size and classes.
  TrainData data = open_data(c.data, c.data_dir, c.loader, c.seed);
  const models::ImageInput& input = data.input;
  torch::manual_seed(c.seed);
  // The model spread over the job (Note [Assembly order]).
  ParallelizeSpec spec;
  spec.model = c.model;
  spec.input = input;
  spec.tp = c.tp;
  spec.sequence_parallel = c.sequence_parallel;
  spec.pipeline = {c.pp, c.microbatches, c.schedule, c.pp_split};
  spec.activation_checkpointing = c.activation_checkpointing;
  spec.strategy = c.strategy;
  spec.device = device;
  Parallelized run = parallelize(spec, comm, [&](const models::Model& m) {
    for (const auto& p : m.parameters())
      memory.parameters += p.numel();
  });
  const std::shared_ptr<models::Model>& model = run.model;
  const Layout& layout = run.layout;
  const std::unique_ptr<Strategy>& strategy = run.strategy;
  const std::shared_ptr<comm::Communicator>& dp = layout.dp;
  memory.ranks = dp->size();
  const tp::TensorParallel* tensor_parallel = layout.tp.handle.get();
  pp::Pipeline* pipeline = layout.pp.pipeline.get();
  if (model->takes_tokens()) add_text_windows(data, c.data, window_length(c, *model));
  if (lead) {
    log::info("training ", c.model, " on ", data.describe, ", ", world, " rank(s) x batch ",
              c.batch_size, ", ", c.epochs, " epoch(s), ", c.strategy.optimizer, " lr ",
              c.strategy.lr, ", seed ", c.seed, ", ", torch::get_num_threads(),
              " thread(s) per rank -> ", c.out);
  }
  if (lead && c.activation_checkpointing > 0) {
    const size_t blocks = model->block_names().size();
    log::info("activation checkpointing: ",
              (blocks + c.activation_checkpointing - 1) / c.activation_checkpointing, " of ",
              blocks, " block(s)", pipeline ? " of this stage" : "",
              " recompute their forward in backward");
  }
  if (lead && tensor_parallel && !pipeline) {
    log::info("mesh: ", parallel::describe(layout.plan),
              c.sequence_parallel ? " (sequence parallel)" : "");
  }
  if (lead && pipeline) {
    std::vector<std::string> names = model->unit_names();
    log::info("mesh: ", parallel::describe(layout.plan),
              c.sequence_parallel ? " (sequence parallel)" : "", ", schedule ", c.schedule, ", ",
              c.microbatches, " micro-batches per batch");
    std::istringstream stages(pp::describe(layout.pp.plan, names));
    for (std::string line; std::getline(stages, line);)
      log::info(line);
  }
  if (lead) log::info("strategy: ", strategy->describe());
  int64_t n_train =
      c.train_samples > 0 ? std::min(c.train_samples, data.train.size) : data.train.size;
  data::DistributedSampler sampler(n_train, dp->rank(), dp->size(), c.seed);
  // Every epoch has the same number of batches (the sampler pads), hence of optimizer steps.
  const int64_t batches_per_epoch = data::num_batches(sampler.samples_per_rank(), c.batch_size);
  const int64_t steps_per_epoch = (batches_per_epoch + c.accum_steps - 1) / c.accum_steps;
  Schedule schedule{c.lr_schedule, c.strategy.lr, steps_per_epoch * c.epochs};
  validate(schedule.config, schedule.lr, schedule.total_steps);
  int64_t start_epoch = 0, global_step = 0;
  // A group the launcher restarted (--max-restarts), or started again in a later round of an
  // elastic job (a node came or went, Note [Elastic rendezvous]), resumes by itself, as
  // torchrun scripts reload their snapshot: the checkpoints in `out` are this job's own.
  const int restart = comm->info().restart_count;
  const int64_t round = env::get_int("DTORCH_ELASTIC_ROUND").value_or(0);
  const bool resume = c.resume || restart > 0 || round > 0;
  if (lead && restart > 0) {
    log::info("restart ", restart, " of the group: resuming from ", c.out);
  } else if (lead && round > 0) {
    log::info("elastic round ", round, ": resuming from ", c.out);
  }
  if (resume) {
    check_tensor_parallel_layout(c);
    if (auto ck = strategy->load_latest(c.out)) {
      start_epoch = ck->data.epoch;
      global_step = ck->data.global_step;
      if (lead) log::info("resuming from ", ck->path, " (", start_epoch, " epoch(s) done)");
      // The saved schedule goes on where it stopped, whatever the flags say now.
      if (auto saved = schedule_of(ck->data.metadata_json, ck->path)) {
        if (lead && !(*saved == schedule)) {
          log::info("the checkpoint's learning-rate schedule continues: ",
                    describe(saved->config, saved->lr, saved->total_steps),
                    " (this run's flags would give ",
                    describe(schedule.config, schedule.lr, schedule.total_steps), ")");
        }
        schedule = *saved;
      }
    } else if (lead) {
      log::info("--resume: no checkpoint in ", c.out, ", starting from scratch");
    }
    // Every rank must resume from the same epoch, or their steps would not match.
    auto e = torch::tensor({double(start_epoch), -double(start_epoch)}, torch::kDouble);
    comm->allreduce(e, comm::ReduceOp::Max, "resume epoch check");
    DTORCH_CHECK_T(CheckpointError, e[0].item<double>() == -e[1].item<double>(),
                   "ranks found different checkpoints in ", c.out,
                   " (is --out on a file system every node shares?)");
  }

  if (lead) {
    log::info("optimizer ", c.strategy.optimizer, ", learning rate ",
              describe(schedule.config, schedule.lr, schedule.total_steps), ", ", steps_per_epoch,
              " step(s) per epoch");
  }
  std::unique_ptr<report::MetricsWriter> metrics;
  if (lead) metrics = std::make_unique<report::MetricsWriter>(c.out + "/metrics.jsonl", resume);
  std::unique_ptr<report::TensorBoardWriter> board;
  if (lead && !c.tensorboard.empty()) {
    board = std::make_unique<report::TensorBoardWriter>(c.tensorboard);
    log::info("TensorBoard events: ", board->path());
  }
  report::ProgressConfig shown = c.progress;
  if (c.print_every > 0 && shown.mode == report::ProgressConfig::Mode::Auto) {
    // The step lines report the progress; a redrawn bar would break them up.
    shown.mode = report::ProgressConfig::Mode::Lines;
    shown.every_steps = 0;
    shown.every_seconds = 0;
  }
  report::ProgressReporter progress(
      lead ? shown : report::ProgressConfig{report::ProgressConfig::Mode::Off});
  PhaseTimes epoch_phases(c.phase_times, device);
  // Note [Batches to the GPU]: the loader's threads pin each batch, the copier moves the next
  // one while the current one trains.
  const bool to_gpu = device.is_cuda();
  DeviceCopier copier(device);
  const int64_t total_steps = steps_per_epoch * c.epochs;
  // The rate of the last optimizer step taken.
  auto last_lr = [&] {
    return schedule.at(std::max<int64_t>(0, global_step - strategy->skipped_steps() - 1));
  };

  std::vector<report::EpochRecord> records;
  for (int64_t epoch = start_epoch; epoch < c.epochs; ++epoch) {
    auto t0 = Clock::now();
    reset_peak_memory(device);
    sampler.set_epoch(epoch);
    auto batches = data::make_batches(sampler.indices(), c.batch_size);
    data::Prefetcher loader(static_cast<int64_t>(batches.size()), c.loader.workers,
                            [&, epoch, to_gpu](int64_t k) {
                              auto [x, y] = data.train.batch(batches[k], epoch);
                              if (!to_gpu) return std::make_pair(x, y);
                              auto both = pinned({x, y});
                              return std::make_pair(both[0], both[1]);
                            });
    if (!batches.empty()) {
      auto [x, y] = loader.next();
      copier.start({x, y});
    }
    progress.start_epoch(epoch, c.epochs, static_cast<int64_t>(batches.size()));
    model->train();
    LossTally epoch_tally;
    const int64_t epoch_first_step = global_step;
    // The window a --print-every line reports on: the steps since the last line this epoch.
    PhaseTimes window_phases(c.phase_times, device);
    LossTally window;
    int64_t window_steps = 0;
    LossTally step_tally;  // the batches of this optimizer step, for TensorBoard
    auto window_start = Clock::now();
    for (size_t i = 0; i < batches.size(); ++i) {
      epoch_phases.start();
      window_phases.start();
      const std::vector<torch::Tensor> batch = copier.ready();
      const torch::Tensor &x = batch[0], &y = batch[1];
      if (i + 1 < batches.size()) {
        auto [next_x, next_y] = loader.next();
        copier.start({next_x, next_y});
      }
      const std::function<void(const char*)> lap = [&](const char* phase) {
        epoch_phases.lap(phase);
        window_phases.lap(phase);
      };
      lap("data");
      // A step fp16 skipped does not advance the schedule (Note [Loss scaling]).
      strategy->set_lr(schedule.at(global_step - strategy->skipped_steps()));
      bool last_micro = (i + 1) % c.accum_steps == 0 || i + 1 == batches.size();
      double l = 0;
      bool stepped = last_micro;
      if (pipeline) {
        l = pipeline_step(*pipeline, *strategy, x, y, c.clip_grad_norm, tensor_parallel, lap);
        stepped = true;
      } else {
        torch::Tensor loss;
        {
          parallel::Autocast autocast(strategy->autocast());
          loss = cross_entropy(model->forward(x), y, tensor_parallel);
        }
        lap("forward");
        strategy->backward(loss / c.accum_steps, last_micro);
        lap("backward");
        if (last_micro) {
          strategy->step(c.clip_grad_norm);
          lap("step");
        }
        l = loss.item<double>();
      }
      const int64_t batch_samples = x.size(0) * dp->size();
      step_tally.add(l, batch_samples);
      epoch_tally.add(l, batch_samples);
      window.add(l, batch_samples);
      if (stepped) {
        ++global_step;
        ++window_steps;
        if (board) {
          board->scalar("train/loss", global_step, step_tally.mean());
          board->scalar("train/lr", global_step, last_lr());
        }
        step_tally = {};
      }
      progress.update(static_cast<int64_t>(i) + 1, l, epoch_tally.samples);
      if (stepped && c.print_every > 0 && global_step % c.print_every == 0) {
        const auto ms = window_phases.take_mean_ms(window_steps);
        const double rate = static_cast<double>(window.samples) / seconds_since(window_start);
        const double lr = last_lr();
        if (lead) {
          log::info("step ", global_step, "/", total_steps, ": loss ", window.mean(), ", lr ", lr,
                    ", ", static_cast<int64_t>(rate), " samples/s", describe_phases(ms));
          std::map<std::string, double> record{{"step", static_cast<double>(global_step)},
                                               {"epoch", static_cast<double>(epoch)},
                                               {"train_loss", window.mean()},
                                               {"lr", lr},
                                               {"samples_per_s", rate}};
          for (const auto& [phase, v] : ms)
            record[phase + "_ms"] = v;
          if (c.strategy.precision == "fp16") {
            record["loss_scale"] = strategy->loss_scale();
            record["skipped_steps"] = static_cast<double>(strategy->skipped_steps());
          }
          metrics->write("step", record);
        }
        window = {};
        window_steps = 0;
        window_start = Clock::now();
      }
    }
    double train_seconds = seconds_since(t0);
    progress.finish_epoch();

    auto mean_loss = torch::tensor({epoch_tally.mean()}, torch::kDouble);
    comm->allreduce(mean_loss, comm::ReduceOp::Avg, "epoch train loss");
    auto [test_loss, test_acc] = evaluate(*model, data.test, c.test_samples, *strategy, *dp, *comm,
                                          tensor_parallel, pipeline);
    report::EpochRecord r;
    r.epoch = epoch;
    r.step = global_step;
    r.train_loss = mean_loss.item<double>();
    r.test_loss = test_loss;
    r.test_accuracy = test_acc;
    r.samples_per_s = static_cast<double>(epoch_tally.samples) / train_seconds;
    r.seconds = seconds_since(t0);
    r.lr = last_lr();
    r.phase_ms = epoch_phases.take_mean_ms(global_step - epoch_first_step);
    if (device.is_cuda()) {
      const DeviceMemory m = device_memory(device);
      r.more["gpu_peak_allocated_bytes"] = static_cast<double>(m.peak_allocated);
      r.more["gpu_peak_reserved_bytes"] = static_cast<double>(m.peak_reserved);
    }
    if (c.strategy.precision == "fp16") {
      r.more["loss_scale"] = strategy->loss_scale();
      r.more["skipped_steps"] = static_cast<double>(strategy->skipped_steps());
    }
    records.push_back(r);
    if (lead) {
      log::info("epoch ", epoch + 1, "/", c.epochs, ": train loss ", r.train_loss, ", test loss ",
                r.test_loss, ", test accuracy ", 100.0 * r.test_accuracy, "%, ",
                static_cast<int64_t>(r.samples_per_s), " samples/s, ", r.seconds, " s",
                describe_phases(r.phase_ms), describe_more(r.more));
      metrics->write_epoch(r);
      if (board) {
        board->scalar("epoch/train_loss", global_step, r.train_loss);
        board->scalar("epoch/test_loss", global_step, r.test_loss);
        board->scalar("epoch/test_accuracy", global_step, r.test_accuracy);
        board->scalar("epoch/samples_per_s", global_step, r.samples_per_s);
        board->scalar("epoch/lr", global_step, r.lr);
        for (const auto& [phase, ms] : r.phase_ms)
          board->scalar("epoch/" + phase + "_ms", global_step, ms);
      }
    }
    strategy->save(c.out, {epoch + 1, global_step, config_json(c, world, schedule, input)},
                   c.keep_checkpoints);
    if (lead && !pipeline)
      checkpoint::forget_pipeline_layout(c.out);  // the stage folders are older now
  }
  {
    auto whole = strategy->whole_parameters();
    checkpoint::StateDict full;
    if (tensor_parallel) {
      for (const auto& kv : tensor_parallel->full_state_dict(*model))  // collective over tp
        full.emplace_back(kv.key(), kv.value());
    }
    if (pipeline && dp->rank() == 0)
      full =
          join_pipeline_stages(*pipeline, tensor_parallel ? full : checkpoint::state_dict(*model));
    if (lead) {
      const checkpoint::SaveFormat format = checkpoint::parse_save_format(c.save_format);
      const std::string path = c.out + "/model" + checkpoint::file_suffix(format);
      if (!tensor_parallel && !pipeline) full = checkpoint::state_dict(*model);
      // For torch.load the tied weights under Python's names too (Note [Tied embedding]).
      if (format == checkpoint::SaveFormat::Torch)
        full = checkpoint::with_python_aliases(full, model->python_aliases());
      checkpoint::write_file_atomically(path, checkpoint::serialize_state_dict(full, format));
      log::info("wrote ", path,
                format == checkpoint::SaveFormat::Torch
                    ? " (a state_dict for Python's torch.load)"
                    : " (safetensors: safetensors.torch.load_file)");
    }
    comm->barrier("model file written");
  }
  return records;
}

}  // namespace

std::vector<report::EpochRecord> train(const TrainConfig& config,
                                       std::shared_ptr<comm::Communicator> comm) {
  TrainConfig c = config;
  resolve(c, {{}, {}, 0, {}, comm->size()});
  report::MemoryContext memory;
  memory.rank = comm->rank();
  memory.ranks = comm->size();
  memory.model = c.model;
  memory.strategy = c.strategy.kind;
  memory.optimizer = c.strategy.optimizer;
  memory.batch_size = c.batch_size;
  memory.activation_checkpointing = c.activation_checkpointing > 0;
  try {
    return train_run(c, std::move(comm), memory);
  } catch (const std::exception& e) {
    if (!report::is_out_of_memory(e)) throw;
    // Note [Out of memory]
    throw OutOfMemoryError(report::out_of_memory_message(e.what(), memory, report::process_memory(),
                                                         device_memory(memory.device)));
  }
}

}  // namespace dtorch::train
