// The trainer's strategies (see strategy.h): DDP with a plain optimizer and single-file
// checkpoints, and the ZeRO stages with sharded optimizers and sharded checkpoints.
#include "dtorch/train/strategy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>

#include "dtorch/checkpoint/pipeline_checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/sharded_join.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/tp/optimizer_state.h"
#include "dtorch/train/loss_scaler.h"
#include "dtorch/train/zero_grad.h"

namespace dtorch::train {

double weight_decay_of(const StrategyConfig& c) {
  return c.weight_decay.value_or(c.optimizer == "adamw" ? 0.01 : 0.0);
}

namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const StrategyConfig& c,
                                                        std::vector<torch::Tensor> params) {
  const double decay = weight_decay_of(c);
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(decay));
  }
  const std::tuple<double, double> betas{c.betas.at(0), c.betas.at(1)};
  if (c.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).betas(betas).eps(c.eps).weight_decay(decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(c.lr).betas(betas).eps(c.eps).weight_decay(decay));
}

void set_lr_of(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups())
    group.options().set_lr(lr);
}

at::ScalarType compute_dtype(const StrategyConfig& c) {
  return c.precision == "bf16" ? at::kBFloat16 : c.precision == "fp16" ? at::kHalf : at::kFloat;
}

parallel::AutocastMode autocast_of(const StrategyConfig& c, at::Device device) {
  return {c.precision != "fp32", device.type(), compute_dtype(c)};
}

// The device of a model's parameters (the CPU for a model without any).
at::Device device_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    return p.device();
  return at::kCPU;
}

// Note [Loss scaling] (train/loss_scaler.h): under --precision fp16 backward runs on the loss
// times the scale, and before each optimizer step every rank checks its gradients (whole, or
// its shards) for inf and nan; the flag is reduced with MAX over each group the strategy spans
// (dp, then tp, then pp: every rank of the job), so an overflow anywhere skips the step
// everywhere. Otherwise the gradients are divided by the scale that produced them (before
// the scaler may raise it), then clipped and applied. The scaler's state rides in each
// checkpoint's metadata ("loss_scaler"), so a resumed run goes on with its scale.
class LossScaling {
 public:
  LossScaling(const StrategyConfig& c, std::vector<comm::Communicator*> groups)
      : groups_(std::move(groups)) {
    if (c.precision == "fp16") scaler_.emplace(c.loss_scale);
  }
  double scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  int64_t skipped() const { return scaler_ ? scaler_->skipped() : 0; }
  torch::Tensor scaled(const torch::Tensor& loss) const {
    return scaler_ ? loss * scaler_->scale() : loss;
  }
  /// Whether to take the optimizer step with `grads`, which it unscales when so. Collective
  /// over every group.
  bool ready(std::vector<at::Tensor> grads) {
    if (!scaler_) return true;
    torch::NoGradGuard no_grad;
    auto flag = torch::full({1}, has_inf_or_nan(grads) ? 1.0f : 0.0f);
    for (comm::Communicator* g : groups_)
      if (g) g->allreduce(flag, comm::ReduceOp::Max, "fp16 overflow check");
    const bool overflow = flag.item<float>() > 0;
    const double used = scaler_->scale();
    if (!scaler_->update(overflow)) return false;
    unscale(grads, 1.0 / used);
    return true;
  }
  /// `metadata_json` with the scaler's state added (unchanged without a scaler).
  std::string with_state(const std::string& metadata_json) const {
    if (!scaler_) return metadata_json;
    auto j = nlohmann::json::parse(metadata_json);
    j["loss_scaler"] = scaler_->to_json();
    return j.dump();
  }
  /// Takes the state a checkpoint's metadata holds, when both have one.
  void restore(const StrategyConfig& c, const std::string& metadata_json) {
    if (!scaler_) return;
    auto j = nlohmann::json::parse(metadata_json, nullptr, false);
    if (!j.is_object() || !j.contains("loss_scaler")) return;
    scaler_ = LossScaler::from_json(c.loss_scale, j.at("loss_scaler"));
  }

 private:
  std::vector<comm::Communicator*> groups_;
  std::optional<LossScaler> scaler_;
};

// The groups a strategy's step spans: its dp group, and the tp and pp groups beside it.
std::vector<comm::Communicator*> step_groups(comm::Communicator& dp,
                                             const std::shared_ptr<tp::TensorParallel>& tp,
                                             const std::shared_ptr<pp::Pipeline>& pipeline) {
  return {&dp, tp ? tp->group().get() : nullptr, pipeline ? &pipeline->group() : nullptr};
}

// The gradients an optimizer step reads (undefined ones left out).
std::vector<at::Tensor> gradients_of(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters())
    if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

// Note [Tensor-parallel checkpoints]
// Under DDP a tensor-parallel run writes the checkpoint a run without tensor parallelism
// would: the unsplit model and its optimizer state, gathered over the tp group of world rank
// 0 (parameters and per-parameter optimizer tensors join as the parameters were split), so it
// resumes at any tp and dp degree, and `dtorch checkpoint consolidate` and Python read it as
// any other. Loading builds the unsplit model and optimizer, restores them, and keeps this
// rank's shards. (ZeRO-1/2 over the dp group write their sharded checkpoints per tp index, in
// <dir>/tp<i>-of-<n>, or <dir>/pp<s>-of-<n>/tp<i>-of-<n> under a pipeline, with
// tensor_parallel.json beside them, and resume at the same tp.) Both briefly hold one unsplit
// copy of the model and optimizer state per rank involved.

// The unsplit model, built without disturbing the random stream training continues with.
std::shared_ptr<models::Model> build_full_model(const TensorParallelism& tp) {
  models::GeneratorStateGuard keep;
  return tp.make_full_model();
}

// DDP: replicated weights (fp32; with --precision bf16 they are the master weights and
// forward runs under bf16 autocast), gradients averaged by the DDP reducer.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(const StrategyConfig& c, std::shared_ptr<models::Model> model,
              std::shared_ptr<comm::Communicator> comm, TensorParallelism tp,
              PipelineParallelism pp)
      : c_(c),
        model_(std::move(model)),
        comm_(std::move(comm)),
        tp_(std::move(tp)),
        pp_(std::move(pp)),
        device_(device_of(*model_)),
        scaling_(c, step_groups(*comm_, tp_.handle, pp_.pipeline)) {
    ddp::Options o = c.ddp;
    if (c.reduce_dtype == "bf16") o.compression = ddp::Compression::BF16;
    ddp_ = ddp::wrap(model_, comm_, o);
    opt_ = make_optimizer(c, model_->parameters());
  }

  void backward(const torch::Tensor& loss, bool sync) override {
    std::optional<ddp::DistributedDataParallel::NoSync> guard;
    if (!sync) guard.emplace(ddp_->no_sync());
    scaling_.scaled(loss).backward();
  }

  void backward_accumulated(const std::function<void()>& work) override {
    {
      auto guard = ddp_->no_sync();
      work();
    }
    ddp_->reduce_accumulated();
  }

  double step(double max_norm) override {
    if (!scaling_.ready(gradients_of(*model_))) {
      zero_grad_to_none(*opt_);
      return 0;
    }
    double norm = 0;
    if (max_norm > 0 && pp_.pipeline) {
      norm = pp_.pipeline->clip_grad_norm(max_norm);  // across every stage
    } else if (max_norm > 0) {
      norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm);
    }
    opt_->step();
    zero_grad_to_none(*opt_);
    return norm;
  }

  std::shared_ptr<void> whole_parameters() override { return nullptr; }

  void save(const std::string& dir, const checkpoint::CheckpointData& data, int keep) override {
    const bool writer = comm_->rank() == 0 && (!tp_.handle || tp_.handle->group()->rank() == 0);
    models::Model* model = model_.get();
    torch::optim::Optimizer* opt = opt_.get();
    std::shared_ptr<models::Model> full;
    std::unique_ptr<torch::optim::Optimizer> full_opt;
    if (tp_.handle && comm_->rank() == 0) {
      // Note [Tensor-parallel checkpoints]: dp rank 0 of every tp index gathers over its tp
      // group (the unsplit model, or the unsplit stages).
      full = build_full_model(tp_);
      full_opt = make_optimizer(c_, full->parameters());
      tp_.handle->load_into(*full, *model_);
      tp::gather_optimizer_state(*tp_.handle, *model_, *opt_, *full, *full_opt);
      model = full.get();
      opt = full_opt.get();
    }
    checkpoint::CheckpointData with_scaler = data;
    with_scaler.metadata_json = scaling_.with_state(data.metadata_json);
    if (writer && !pp_.pipeline) checkpoint::save_checkpoint(dir, with_scaler, *model, opt, keep);
    if (writer && pp_.pipeline) {
      save_stages(dir, with_scaler, keep, *model, *opt);
      if (pp_.stage() == 0) checkpoint::write_pipeline_layout(dir, c_.model, pp_.plan);
    }
    comm_->barrier("checkpoint written");
  }

  // Note [Pipeline checkpoints]: each stage into its own folder; an interleaved rank's
  // several stages each with its parameters' optimizer state, as one-stage-per-rank runs
  // write them (so any layout resumes them).
  void save_stages(const std::string& dir, const checkpoint::CheckpointData& data, int keep,
                   models::Model& model, torch::optim::Optimizer& opt) {
    const int n = static_cast<int>(pp_.plan.stages.size());
    auto* merged = dynamic_cast<models::StageUnion*>(&model);
    if (!merged) {
      checkpoint::save_checkpoint(dir + checkpoint::pipeline_folder(pp_.stage(), n), data, model,
                                  &opt, keep);
      return;
    }
    const auto& stages = merged->stages();
    for (size_t k = 0; k < stages.size(); ++k) {
      auto stage_opt = make_optimizer(c_, stages[k]->parameters());
      for (const auto& p : stages[k]->parameters()) {
        auto it = opt.state().find(compat::optimizer_state_key(p));
        if (it != opt.state().end())
          stage_opt->state()[compat::optimizer_state_key(p)] = it->second->clone();
      }
      checkpoint::save_checkpoint(dir + checkpoint::pipeline_folder(pp_.stages[k], n), data,
                                  *stages[k], stage_opt.get(), keep);
    }
  }

  std::optional<checkpoint::LoadedCheckpoint> load_latest(const std::string& dir) override {
    // Note [Pipeline checkpoints]: stage folders, or a whole checkpoint a stage reads from.
    std::vector<checkpoint::SavedStage> saved = checkpoint::read_pipeline_layout(dir);
    if (saved.empty() && pp_.pipeline) saved.push_back({dir, {0, model_->num_units()}});
    auto load = [&](models::Model& m, torch::optim::Optimizer& o) {
      auto loaded = saved.empty()
                        ? checkpoint::load_latest_checkpoint(dir, m, &o)
                        : checkpoint::load_from_stages(saved, c_.model, c_.input, m, o,
                                                       [this](std::vector<torch::Tensor> p) {
                                                         return make_optimizer(c_, std::move(p));
                                                       });
      if (loaded) scaling_.restore(c_, loaded->data.metadata_json);
      return loaded;
    };
    if (!tp_.handle) return load(*model_, *opt_);
    // Note [Tensor-parallel checkpoints]: into the unsplit model, then keep this rank's shards.
    auto full = build_full_model(tp_);
    auto full_opt = make_optimizer(c_, full->parameters());
    auto loaded = load(*full, *full_opt);
    if (!loaded) return loaded;
    tp_.handle->load_from(*model_, *full);
    tp::shard_optimizer_state(*tp_.handle, *full, *full_opt, *model_, *opt_);
    parallel::move_state_to_parameters(*opt_);
    return loaded;
  }

  zero::WaitSeconds comm_waits() const override { return {0, ddp_->comm_wait_seconds()}; }

  zero::MemoryStats memory() const override {
    zero::MemoryStats m;
    for (const auto& p : model_->parameters())
      m.param_bytes += static_cast<int64_t>(p.nbytes());
    for (const auto& b : ddp_->plan().buckets)
      m.grad_bytes += b.numel * static_cast<int64_t>(c10::elementSize(b.dtype));
    m.optim_bytes = parallel::state_bytes(*opt_);
    m.peak_param_bytes = m.param_bytes;
    return m;
  }

  parallel::AutocastMode autocast() const override { return autocast_of(c_, device_); }
  double loss_scale() const override { return scaling_.scale(); }
  int64_t skipped_steps() const override { return scaling_.skipped(); }
  at::Device device() const override { return device_; }
  void set_lr(double lr) override { set_lr_of(*opt_, lr); }

  std::string describe() const override {
    return str("ddp (", ddp_->plan().buckets.size(), " buckets), ", c_.precision, " compute, ",
               c_.reduce_dtype, " gradient reduction, on ", device_);
  }

 private:
  StrategyConfig c_;
  std::shared_ptr<models::Model> model_;
  std::shared_ptr<comm::Communicator> comm_;
  TensorParallelism tp_;
  PipelineParallelism pp_;
  at::Device device_;
  LossScaling scaling_;
  std::shared_ptr<ddp::DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

// ZeRO-1/2/3: sharded optimizer state (and gradients, and parameters), sharded checkpoints
// that reload at any world size (Note [Sharded checkpoint format]).
class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(const StrategyConfig& c, std::shared_ptr<models::Model> model,
               std::shared_ptr<comm::Communicator> comm, const TensorParallelism& tp,
               PipelineParallelism pp)
      : c_(c),
        model_(std::move(model)),
        comm_(std::move(comm)),
        pp_(std::move(pp)),
        device_(device_of(*model_)),
        scaling_(c, step_groups(*comm_, tp.handle, pp_.pipeline)) {
    if (pp_.pipeline) {
      // Note [Pipeline checkpoints]
      stage_folder_ =
          checkpoint::pipeline_folder(pp_.stage(), static_cast<int>(pp_.plan.stages.size()));
    }
    if (tp.handle) {
      // Note [Tensor-parallel checkpoints]: per tp index, inside the stage's folder.
      const auto& g = tp.handle->group();
      tp_folder_ = str("/tp", g->rank(), "-of-", g->size());
      tp_ = tp.handle;
    }
    zero::Options o;
    o.stage = c.kind.back() - '0';
    o.bucket_cap_mb = c.ddp.bucket_cap_mb;
    o.min_unit_params = c.min_unit_params;
    o.reshard_root_after_forward = c.reshard_root_after_forward;
    o.reshard_after_microbatch = c.reshard_after_microbatch;
    o.param_dtype = compute_dtype(c);
    o.reduce_dtype = c.reduce_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
    o.broadcast_buffers = c.ddp.broadcast_buffers;
    sharded_ = zero::shard(model_, comm_, o, [&](std::vector<torch::Tensor> p) {
      return make_optimizer(c, std::move(p));
    });
  }

  void backward(const torch::Tensor& loss, bool sync) override {
    std::optional<zero::ShardedModel::NoSync> guard;
    if (!sync) guard.emplace(sharded_->no_sync());
    scaling_.scaled(loss).backward();
  }

  void backward_accumulated(const std::function<void()>& work) override {
    {
      auto guard = sharded_->accumulate_whole();
      work();
    }
    sharded_->reduce_accumulated();
  }

  double step(double max_norm) override {
    if (!scaling_.ready(sharded_->gradient_shards())) {
      sharded_->zero_grad();
      return 0;
    }
    zero::NormScope scope;
    if (pp_.pipeline) {  // the norm of every stage's shards, a tied parameter counted once
      scope.across = &pp_.pipeline->group();
      scope.counted_elsewhere = pp_.pipeline->counted_elsewhere();
    }
    double norm = max_norm > 0 ? sharded_->clip_grad_norm(max_norm, scope) : 0;
    sharded_->step();
    sharded_->zero_grad();
    return norm;
  }

  std::shared_ptr<void> whole_parameters() override {
    return std::make_shared<zero::ShardedModel::FullParams>(sharded_.get());
  }

  void save(const std::string& out, const checkpoint::CheckpointData& data, int keep) override {
    const std::string dir = out + stage_folder_ + tp_folder_;
    checkpoint::ShardedCheckpointData d;
    d.epoch = data.epoch;
    d.global_step = data.global_step;
    d.metadata_json = scaling_.with_state(data.metadata_json);
    d.layouts = unit_layouts();
    std::vector<checkpoint::ShardPiece> mine;
    for (auto& s : sharded_->checkpoint_slices())
      mine.push_back({s.key, s.full_numel, s.begin, s.data});
    std::vector<std::pair<std::string, torch::Tensor>> full;
    for (const auto& b : model_->named_buffers())
      full.emplace_back("buffer/" + b.key(), b.value());
    full.emplace_back("optim/step", torch::tensor({sharded_->optimizer_steps()}, torch::kLong));
    full.emplace_back("rng_state", models::cpu_generator_state());
    checkpoint::save_sharded_checkpoint(dir, d, mine, full, *comm_, keep);
    if (pp_.pipeline && pp_.stage() == 0 && comm_->rank() == 0)
      checkpoint::write_pipeline_layout(out, c_.model, pp_.plan, zero_stage_folders());
    if (tp_ && tp_->group()->rank() == 0 && comm_->rank() == 0) {
      // How each parameter is split across the tp folders, for `dtorch checkpoint consolidate`.
      nlohmann::json spec = {{"tp", tp_->group()->size()}, {"sharded", nlohmann::json::object()}};
      for (const auto& [name, split] : tp_->sharded())
        spec["sharded"][name] = {{"dim", split.dim}, {"fused", split.fused}};
      const std::string json = spec.dump() + "\n";
      checkpoint::write_file_atomically(out + stage_folder_ + "/tensor_parallel.json",
                                        std::vector<char>(json.begin(), json.end()));
    }
  }

  // Note [Pipeline checkpoints]: a rank's shards hold all of its stages, in the folder of
  // the first; pipeline.json names, for every stage, the folder that holds it.
  std::vector<std::string> zero_stage_folders() const {
    const int n = static_cast<int>(pp_.plan.stages.size());
    const int ranks = pp_.pipeline->group().size();
    std::vector<std::string> folders;
    for (int s = 0; s < n; ++s)
      folders.push_back(checkpoint::pipeline_folder(s % ranks, n));
    return folders;
  }

  // Note [Resharding by name]: whatever units and stages wrote the shards, each of this
  // rank's slices is read by parameter name, so ZeRO resumes at any --pp, schedule, dp size
  // and wrap policy (the same --tp: Note [Tensor-parallel checkpoints]).
  std::optional<checkpoint::LoadedCheckpoint> load_latest(const std::string& run_dir) override {
    std::vector<std::string> stages;  // the saved stages that overlap this rank's units
    const models::UnitRange mine = model_->units();
    for (const checkpoint::SavedStage& s : checkpoint::read_pipeline_layout(run_dir)) {
      if (s.units.end <= mine.begin || s.units.begin >= mine.end) continue;
      if (std::find(stages.begin(), stages.end(), s.folder) == stages.end())
        stages.push_back(s.folder);
    }
    if (stages.empty()) stages.push_back(run_dir);
    std::vector<std::string> folders;
    for (const auto& s : stages)
      folders.push_back(s + tp_folder_);
    auto saved = checkpoint::ShardedJoin::open(folders);
    if (!saved) {
      // DDP's whole checkpoints are not shards: named, not a silent fresh start.
      for (const auto& s : stages)
        DTORCH_CHECK_T(CheckpointError, checkpoint::list_checkpoints(s).empty(), s,
                       " holds ddp's checkpoints, not ZeRO's shards: resume with --strategy ddp, ",
                       "or start a new --out");
      return std::nullopt;
    }
    check_layout(*saved);
    torch::NoGradGuard no_grad;
    sharded_->init_optimizer_state();
    const auto layouts = unit_layouts();
    for (auto& s : sharded_->checkpoint_slices()) {
      // "param/<unit>" or "optim/<unit>/<state>"
      const bool param = s.key.rfind("param/", 0) == 0;
      const size_t cut = param ? s.key.size() : s.key.rfind('/');
      const std::string unit = s.key.substr(6, cut - 6);
      const std::string kind = param ? "param" : "optim" + s.key.substr(cut);
      s.data.copy_(saved->read_range(layouts.at(unit), kind, s.begin, s.begin + s.data.numel(),
                                     s.data.scalar_type()));
    }
    if (saved->has_full("optim/step")) {
      sharded_->set_optimizer_steps(saved->read_full("optim/step").item<int64_t>());
    }
    for (const auto& b : model_->named_buffers()) {
      b.value().copy_(saved->read_full("buffer/" + b.key()));
    }
    if (saved->has_full("rng_state")) {
      // The generator of the stage that held this rank's first parameter.
      models::set_cpu_generator_state(saved->read_full("rng_state", sharded_->param_names().at(0)));
    }
    sharded_->publish_params();
    checkpoint::LoadedCheckpoint out;
    out.path = saved->dir();
    out.data.epoch = saved->data().epoch;
    out.data.global_step = saved->data().global_step;
    out.data.metadata_json = saved->data().metadata_json;
    scaling_.restore(c_, out.data.metadata_json);
    return out;
  }

  zero::MemoryStats memory() const override { return sharded_->memory(); }
  zero::WaitSeconds comm_waits() const override { return sharded_->wait_seconds(); }

  parallel::AutocastMode autocast() const override { return autocast_of(c_, device_); }
  double loss_scale() const override { return scaling_.scale(); }
  int64_t skipped_steps() const override { return scaling_.skipped(); }
  at::Device device() const override { return device_; }
  void set_lr(double lr) override { set_lr_of(sharded_->optimizer(), lr); }

  std::string describe() const override {
    return str(c_.kind, " (", sharded_->plan().units.size(), " units), ", c_.precision,
               " compute, ", c_.reduce_dtype, " gradient reduction, on ", device_);
  }

 private:
  // Each unit's parameters: names, shapes and offsets in its flat tensor.
  std::map<std::string, std::vector<checkpoint::FlatLayoutEntry>> unit_layouts() const {
    std::map<std::string, std::vector<checkpoint::FlatLayoutEntry>> layouts;
    for (const auto& unit : sharded_->plan().units) {
      auto& layout = layouts[unit.name];
      for (const auto& e : unit.entries) {
        layout.push_back(
            {sharded_->param_names()[e.param], sharded_->param_shapes()[e.param], e.offset});
      }
    }
    return layouts;
  }

  // The checkpoint must describe this model: same parameter names and shapes, in any units.
  void check_layout(const checkpoint::ShardedJoin& saved) {
    const auto& names = sharded_->param_names();
    for (size_t i = 0; i < names.size(); ++i) {
      auto shape = saved.shape(names[i]);
      DTORCH_CHECK_T(CheckpointError, shape.has_value(), saved.dir(), " has no parameter ",
                     names[i], ": it was written for another model; use a new --out directory");
      DTORCH_CHECK_T(CheckpointError, *shape == sharded_->param_shapes()[i], saved.dir(),
                     ": parameter ", names[i],
                     " has another shape; it was written for another "
                     "model configuration");
    }
  }

  StrategyConfig c_;
  std::shared_ptr<models::Model> model_;
  std::shared_ptr<comm::Communicator> comm_;
  PipelineParallelism pp_;
  at::Device device_;
  LossScaling scaling_;
  std::shared_ptr<zero::ShardedModel> sharded_;
  // "/pp<s>-of-<n>" under a pipeline, else empty
  std::string stage_folder_;
  // "/tp<i>-of-<n>" under tensor parallelism, inside the stage folder; else empty
  std::string tp_folder_;
  std::shared_ptr<tp::TensorParallel> tp_;
};

}  // namespace

void validate(const StrategyConfig& c) {
  DTORCH_CHECK_T(ConfigError,
                 c.kind == "ddp" || c.kind == "zero1" || c.kind == "zero2" || c.kind == "zero3",
                 "unknown strategy '", c.kind, "'; use ddp, zero1, zero2 or zero3");
  DTORCH_CHECK_T(ConfigError,
                 c.precision == "fp32" || c.precision == "bf16" || c.precision == "fp16",
                 "unknown precision '", c.precision, "'; use fp32, bf16 or fp16");
  DTORCH_CHECK_T(ConfigError, c.device == "cpu" || c.device == "cuda" || c.device == "auto",
                 "--device '", c.device, "' is not a device: use cpu, cuda or auto");
  DTORCH_CHECK_T(ConfigError, c.reduce_dtype == "fp32" || c.reduce_dtype == "bf16",
                 "unknown gradient reduction dtype '", c.reduce_dtype, "'; use fp32 or bf16");
  DTORCH_CHECK_T(ConfigError,
                 c.optimizer == "sgd" || c.optimizer == "adam" || c.optimizer == "adamw",
                 "unknown optimizer '", c.optimizer, "'; use sgd, adam or adamw");
  DTORCH_CHECK_T(ConfigError, weight_decay_of(c) >= 0, "--weight-decay must be >= 0 (got ",
                 weight_decay_of(c), ")");
  DTORCH_CHECK_T(ConfigError, c.betas.size() == 2, "--betas takes two numbers, as 0.9,0.999 (got ",
                 c.betas.size(), ")");
  DTORCH_CHECK_T(ConfigError,
                 c.betas[0] >= 0 && c.betas[0] < 1 && c.betas[1] >= 0 && c.betas[1] < 1, "--betas ",
                 c.betas[0], ",", c.betas[1], ": each must lie in [0, 1), as 0.9,0.999");
  DTORCH_CHECK_T(ConfigError, c.optimizer != "sgd" || (c.betas == std::vector<double>{0.9, 0.999}),
                 "--betas apply to adam and adamw; with --optimizer sgd set --momentum instead");
  DTORCH_CHECK_T(ConfigError, c.eps > 0 && c.eps < 1, "--eps ", c.eps,
                 " must lie between 0 and 1 (PyTorch's default: 1e-8)");
  DTORCH_CHECK_T(ConfigError, c.ddp.bucket_cap_mb > 0, "--bucket-cap-mb must be positive");
  DTORCH_CHECK_T(ConfigError, c.min_unit_params >= 0, "--min-unit-params must be >= 0");
  DTORCH_CHECK_T(ConfigError, !c.reshard_root_after_forward || c.kind == "zero3",
                 "--reshard-root-after-forward releases ZeRO-3's root unit; it needs --strategy "
                 "zero3 (got ",
                 c.kind, ")");
  validate(c.loss_scale);
}

at::Device resolve_run_device(const std::string& spec, const launch::RankInfo& job) {
  const bool share = comm::comm_options_from_env().backend == "gloo";
  const at::Device d =
      resolve_device(spec, job.local_rank, job.local_world_size, cuda_availability(), share);
  use_device(d);
  return d;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& c,
                                        std::shared_ptr<models::Model> model,
                                        std::shared_ptr<comm::Communicator> comm,
                                        TensorParallelism tp, PipelineParallelism pp) {
  validate(c);
  DTORCH_CHECK_T(
      ConfigError, c.precision != "fp16" || device_of(*model).is_cuda() || compat::kTorch2,
      "--precision fp16 on the CPU needs LibTorch 2.x's CPU autocast (this is ", TORCH_VERSION,
      ", whose CPU autocast has bfloat16 only): use --precision bf16, or "
      "--device cuda");
  if (c.kind == "ddp")
    return std::make_unique<DdpStrategy>(c, model, comm, std::move(tp), std::move(pp));
  return std::make_unique<ZeroStrategy>(c, model, comm, std::move(tp), std::move(pp));
}

}  // namespace dtorch::train
