// DDP as a strategy: replicated weights and a plain optimizer; checkpoints in one file or shared
// by the ranks (Note [Saving replicated state]), whole models under tensor parallelism (Note
// [Tensor-parallel checkpoints]).
#include "dtorch/train/strategy/strategy_parts.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>

#include "dtorch/checkpoint/pipeline_checkpoint.h"
#include "dtorch/checkpoint/replicated_checkpoint.h"
#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/stage_union.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/grad_clip.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/parallel/tp/optimizer_state.h"
#include "dtorch/train/strategy/zero_grad.h"

namespace dtorch::train {
inline namespace strategy {
namespace {

// Note [Tensor-parallel checkpoints]
// Under DDP a tensor-parallel run writes the checkpoint a run without tensor parallelism
// would: the unsplit model and its optimizer state, gathered over the tp group of world rank
// 0 (parameters and per-parameter optimizer tensors join as the parameters were split), so it
// resumes at any tp and dp degree, and `dtorch checkpoint consolidate` and Python read it as
// any other. Loading builds the unsplit model and optimizer, restores them, and keeps this
// rank's shards. (ZeRO-1/2 over the dp group write their sharded checkpoints per tp index, in
// <dir>/tp<i>-of-<n>, or <dir>/pp<s>-of-<n>/tp<i>-of-<n> under a pipeline, with
// tensor_parallel.json beside them, and resume at the same tp.) Both briefly hold one unsplit
// copy of the model and optimizer state per rank involved. When DDP's ranks share the saves
// (Note [Saving replicated state]), the gathering ranks each write a share of the unsplit
// model in the sharded format, so it resumes as a run without tp would, under any strategy.

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
        scaling_(c.precision, step_groups(*comm_, tp_.handle, pp_.pipeline), device_) {
    ddp::Options o = c.ddp;
    if (c.precision.reduce_dtype == ReduceDtype::BF16) o.compression = ddp::Compression::BF16;
    ddp_ = ddp::wrap(model_, comm_, o);
    opt_ = make_optimizer(c.optimizer, model_->parameters());
    scaling_.set_optimizer(opt_.get());
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

  torch::Tensor step(double max_norm) override {
    const at::Tensor found_inf = scaling_.check_and_unscale(gradients_of(*model_));
    torch::Tensor norm;
    if (max_norm > 0 && pp_.pipeline) {
      norm = pp_.pipeline->clip_grad_norm(max_norm);  // across every stage
    } else if (max_norm > 0) {
      const std::vector<at::Tensor> grads = gradients_of(*model_);
      norm = parallel::clip_to_norm(grads, parallel::sum_of_squares(grads, device_), max_norm);
    }
    optim::step_unless(*opt_, found_inf);
    zero_grad_to_none(*opt_);
    return norm;
  }

  std::shared_ptr<void> whole_parameters() override { return nullptr; }
  void each_whole_parameter(const checkpoint::TakeTensor& take) override {
    for (const auto& p : model_->named_parameters())
      take(p.key(), p.value().detach());
  }

  // Note [Saving replicated state] under tensor and pipeline parallelism: the ranks that share
  // the writing of what one file would hold. Without tp, this stage's dp group (the job's
  // group). Under tp only dp rank 0 of each tp index holds the unsplit model or stage (Note
  // [Tensor-parallel checkpoints]), so those, its tp group, share it: a group of their own for
  // the jobs, made by every tp group alike. Null on the ranks that write nothing.
  comm::Communicator* share_writers() {
    if (!tp_.handle) return comm_.get();
    if (!tp_writers_) {
      std::vector<int> all(tp_.handle->group()->size());
      std::iota(all.begin(), all.end(), 0);
      tp_writers_ = tp_.handle->group()->split(all, "checkpoint");
    }
    return comm_->rank() == 0 ? tp_writers_.get() : nullptr;
  }

  // Whether the ranks share the writing (Note [Saving replicated state]) rather than one
  // writing it all. Collective under tp and pp: `auto` weighs the whole model, every rank's
  // part summed, so that every stage and tp index decides alike.
  bool sharded_saves() {
    const int writers = tp_.handle ? tp_.handle->group()->size() : comm_->size();
    if (c_.checkpoint_layout != CheckpointLayout::Auto)
      return c_.checkpoint_layout == CheckpointLayout::Sharded;
    int64_t bytes = parallel::state_bytes(*opt_);
    for (const auto& p : model_->parameters())
      bytes += static_cast<int64_t>(p.nbytes());
    at::Tensor whole = torch::tensor({bytes}, torch::kLong);
    if (tp_.handle) tp_.handle->group()->allreduce(whole, comm::ReduceOp::Sum, "checkpoint size");
    if (pp_.pipeline)
      pp_.pipeline->group().allreduce(whole, comm::ReduceOp::Sum, "checkpoint size");
    return writers > 1 && whole.item<int64_t>() >= kAutoShardedBytes;
  }

  SaveJob stage(const std::string& dir, const checkpoint::CheckpointData& data, int keep,
                bool background) override {
    scaling_.settle();  // the last step's outcome, before its optimizer state is read
    const bool shared = sharded_saves();
    models::Model* model = model_.get();
    torch::optim::Optimizer* opt = opt_.get();
    // What the job reads and training does not change: the gathered unsplit model under tp,
    // and the optimizers a pipeline rank's stages are saved with.
    std::vector<std::shared_ptr<void>> kept;
    if (tp_.handle && comm_->rank() == 0) {
      // Note [Tensor-parallel checkpoints]: dp rank 0 of every tp index gathers over its tp
      // group (the unsplit model, or the unsplit stages).
      std::shared_ptr<models::Model> full = build_full_model(tp_);
      std::shared_ptr<torch::optim::Optimizer> full_opt =
          make_optimizer(c_.optimizer, full->parameters());
      tp_.handle->load_into(*full, *model_);
      tp::gather_optimizer_state(*tp_.handle, *model_, *opt_, *full, *full_opt);
      model = full.get();
      opt = full_opt.get();
      kept = {full, full_opt};
    }
    // Note [Checkpoints in the background]: the state is copied only when the job runs later
    // and training could change it (the gathered unsplit model is a copy already).
    const bool copy = background && kept.empty();
    checkpoint::CheckpointData with_scaler = data;
    with_scaler.metadata_json = scaling_.with_state(data.metadata_json);
    if (shared) return shared_job(dir, with_scaler, *model, opt, copy, keep, std::move(kept));
    const bool writer = comm_->rank() == 0 && (!tp_.handle || tp_.handle->group()->rank() == 0);
    std::vector<std::pair<std::string, checkpoint::CheckpointState>> states;  // folder, state
    if (writer && !pp_.pipeline)
      states.emplace_back(dir, checkpoint::checkpoint_state(with_scaler, *model, opt, copy));
    if (writer && pp_.pipeline) stage_states(dir, with_scaler, *model, *opt, copy, states, kept);
    const bool layout = writer && pp_.pipeline && pp_.stage() == 0;
    return [states = std::move(states), kept = std::move(kept), dir, keep, layout,
            model_name = c_.model, plan = pp_.plan](comm::Communicator& group) {
      // The writer (rank 0) says how it went, so no rank waits on one that failed.
      std::string problem;
      try {
        for (const auto& [folder, state] : states)
          checkpoint::write_checkpoint_file(folder, checkpoint::checkpoint_file(state), keep);
        if (layout) checkpoint::write_pipeline_layout(dir, model_name, plan);
      } catch (const std::exception& e) {
        problem = e.what();
      }
      problem = group.broadcast_string(problem, 0, "checkpoint written");
      DTORCH_CHECK_T(CheckpointError, problem.empty(), problem);
    };
  }

  // The job of a save the ranks share (Note [Saving replicated state]): each writer its share
  // of `model` (this rank's, or under tp the unsplit one) into the run folder or, under a
  // pipeline, into its first stage's folder as ZeRO does (Note [Pipeline checkpoints]).
  SaveJob shared_job(const std::string& dir, const checkpoint::CheckpointData& data,
                     const models::Model& model, const torch::optim::Optimizer* opt, bool copy,
                     int keep, std::vector<std::shared_ptr<void>> kept) {
    comm::Communicator* writers = share_writers();
    checkpoint::ReplicatedShare share;
    if (writers)
      share =
          checkpoint::replicated_share(data, model, opt, writers->rank(), writers->size(), copy);
    const int stages = static_cast<int>(pp_.plan.stages.size());
    const std::string folder =
        pp_.pipeline ? dir + checkpoint::pipeline_folder(pp_.stage(), stages) : dir;
    std::vector<std::string> layout;  // pipeline.json's folders, written by one rank
    if (pp_.pipeline && pp_.stage() == 0 && writers && writers->rank() == 0)
      layout = checkpoint::folders_by_rank(stages, pp_.pipeline->group().size());
    auto write = [share = std::move(share), folder, dir, keep, layout, model_name = c_.model,
                  plan = pp_.plan](comm::Communicator& group) {
      checkpoint::save_sharded_checkpoint(folder, share.data, share.mine, share.full, group, keep);
      if (!layout.empty()) checkpoint::write_pipeline_layout(dir, model_name, plan, layout);
    };
    if (!tp_.handle) return write;
    // Under tp the writers are dp rank 0's tp group; each dp group hears how it went.
    return [write = std::move(write), writers, kept = std::move(kept)](comm::Communicator& group) {
      std::string problem;
      try {
        if (writers) write(*writers);
      } catch (const std::exception& e) {
        problem = e.what();
      }
      problem = group.broadcast_string(problem, 0, "checkpoint written");
      DTORCH_CHECK_T(CheckpointError, problem.empty(), problem);
    };
  }

  comm::Communicator& save_group() override { return *comm_; }

  // Note [Pipeline checkpoints]: each stage into its own folder; an interleaved rank's
  // several stages each with its parameters' optimizer state, as one-stage-per-rank runs
  // write them (so any layout resumes them).
  void stage_states(const std::string& dir, const checkpoint::CheckpointData& data,
                    models::Model& model, torch::optim::Optimizer& opt, bool copy,
                    std::vector<std::pair<std::string, checkpoint::CheckpointState>>& states,
                    std::vector<std::shared_ptr<void>>& kept) {
    const int n = static_cast<int>(pp_.plan.stages.size());
    auto* merged = dynamic_cast<models::StageUnion*>(&model);
    if (!merged) {
      states.emplace_back(dir + checkpoint::pipeline_folder(pp_.stage(), n),
                          checkpoint::checkpoint_state(data, model, &opt, copy));
      return;
    }
    const auto& stages = merged->stages();
    for (size_t k = 0; k < stages.size(); ++k) {
      std::shared_ptr<torch::optim::Optimizer> stage_opt =
          make_optimizer(c_.optimizer, stages[k]->parameters());
      for (const auto& p : stages[k]->parameters()) {
        auto it = opt.state().find(compat::optimizer_state_key(p));
        if (it != opt.state().end())
          stage_opt->state()[compat::optimizer_state_key(p)] = it->second->clone();
      }
      states.emplace_back(dir + checkpoint::pipeline_folder(pp_.stages[k], n),
                          checkpoint::checkpoint_state(data, *stages[k], stage_opt.get(), copy));
      kept.push_back(stage_opt);
    }
  }

  std::optional<checkpoint::LoadedCheckpoint> load_latest(const std::string& dir) override {
    // Note [Pipeline checkpoints]: shards read by name (Note [Resharding by name]), else stage
    // folders, or a whole checkpoint a stage reads from.
    auto load = [&](models::Model& m, torch::optim::Optimizer& o) {
      std::optional<checkpoint::LoadedCheckpoint> loaded;
      if (auto saved = newer_shards(checkpoint::folders_holding(dir, m.units()))) {
        loaded = checkpoint::load_replicated(*saved, m, &o);
      } else {
        std::vector<checkpoint::SavedStage> stages = checkpoint::read_pipeline_layout(dir);
        if (stages.empty() && pp_.pipeline) stages.push_back({dir, {0, model_->num_units()}});
        loaded = stages.empty()
                     ? checkpoint::load_latest_checkpoint(dir, m, &o)
                     : checkpoint::load_from_stages(
                           stages, c_.model, c_.input, m, o, [this](std::vector<torch::Tensor> p) {
                             return make_optimizer(c_.optimizer, std::move(p));
                           });
      }
      if (loaded) scaling_.restore(c_.precision, loaded->data.metadata_json);
      return loaded;
    };
    if (!tp_.handle) return load(*model_, *opt_);
    // Note [Tensor-parallel checkpoints]: into the unsplit model, then keep this rank's shards.
    auto full = build_full_model(tp_);
    auto full_opt = make_optimizer(c_.optimizer, full->parameters());
    auto loaded = load(*full, *full_opt);
    if (!loaded) return loaded;
    tp_.handle->load_from(*model_, *full);
    tp::shard_optimizer_state(*tp_.handle, *full, *full_opt, *model_, *opt_);
    parallel::move_state_to_parameters(*opt_);
    return loaded;
  }

  // The sharded checkpoint `folders` hold together when it is newer than the newest .dtc in
  // any of them (a run that changed --checkpoint-layout or its world size may hold both): any
  // strategy's, read by name. Nullopt when they hold no shards.
  static std::optional<checkpoint::ShardedJoin> newer_shards(
      const std::vector<std::string>& folders) {
    if (std::all_of(folders.begin(), folders.end(), [](const std::string& f) {
          return checkpoint::list_sharded_checkpoints(f).empty();
        }))
      return std::nullopt;
    auto saved = checkpoint::ShardedJoin::open(folders);
    for (const std::string& f : folders) {
      const std::vector<std::string> files = checkpoint::list_checkpoints(f);
      if (saved && !files.empty() &&
          checkpoint::checkpoint_epoch(files.front()) > saved->data().epoch)
        return std::nullopt;
    }
    return saved;
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

  parallel::AutocastMode autocast() const override { return autocast_of(c_.precision, device_); }
  double loss_scale() const override { return scaling_.scale(); }
  int64_t skipped_steps() const override { return scaling_.skipped(); }
  at::Device device() const override { return device_; }
  void set_lr(double lr) override { set_lr_of(*opt_, lr); }

  std::string describe() const override {
    return str("ddp (", ddp_->plan().buckets.size(), " buckets), ", name_of(c_.precision.compute),
               " compute, ", name_of(c_.precision.reduce_dtype), " gradient reduction, on ",
               device_);
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
  std::shared_ptr<comm::Communicator> tp_writers_;  // share_writers()'s group under tp
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(const StrategyConfig& c,
                                            std::shared_ptr<models::Model> model,
                                            std::shared_ptr<comm::Communicator> comm,
                                            TensorParallelism tp, PipelineParallelism pp) {
  return std::make_unique<DdpStrategy>(c, std::move(model), std::move(comm), std::move(tp),
                                       std::move(pp));
}

}  // namespace strategy
}  // namespace dtorch::train
