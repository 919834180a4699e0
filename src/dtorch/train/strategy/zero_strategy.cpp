// The ZeRO stages as a strategy: sharded optimizer state, gradients and parameters over the dp
// group, and sharded checkpoints that reload at any world size.
#include "dtorch/train/strategy/strategy_parts.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <tuple>

#include "dtorch/checkpoint/pipeline_checkpoint.h"
#include "dtorch/checkpoint/sharded_checkpoint.h"
#include "dtorch/checkpoint/sharded_join.h"
#include "dtorch/checkpoint/state_dict.h"
#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/models/unit_seeds.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/optimizer_state.h"
#include "dtorch/train/strategy/zero_grad.h"

namespace dtorch::train {
inline namespace strategy {
namespace {

// ZeRO-1/2/3: sharded optimizer state (and gradients, and parameters), sharded checkpoints
// that reload at any world size (Note [Sharded checkpoint format]).
class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(const StrategyConfig& c, std::shared_ptr<models::Model> model,
               std::shared_ptr<comm::Communicator> comm, const TensorParallelism& tp,
               PipelineParallelism pp, HybridSharding hybrid)
      : c_(c),
        model_(std::move(model)),
        comm_(std::move(comm)),
        hybrid_(std::move(hybrid)),
        shards_(hybrid_.shard ? hybrid_.shard : comm_),
        pp_(std::move(pp)),
        device_(device_of(*model_)),
        scaling_(c.precision, step_groups(*shards_, tp.handle, pp_.pipeline), device_) {
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
    o.stage = zero_stage(c.kind);
    o.bucket_cap_mb = c.ddp.bucket_cap_mb;
    o.min_unit_params = c.min_unit_params;
    o.reshard_root_after_forward = c.reshard_root_after_forward;
    o.reshard_after_microbatch = c.reshard_after_microbatch;
    o.param_dtype = compute_dtype(c.precision);
    o.reduce_dtype =
        c.precision.reduce_dtype == ReduceDtype::BF16 ? torch::kBFloat16 : torch::kFloat;
    o.broadcast_buffers = c.ddp.broadcast_buffers;
    if (c.offload.optimizer == OffloadDevice::NVMe) {
      o.optimizer_offload.dir = c.offload.dir;
      o.optimizer_offload.buffers = c.offload.buffers;
      o.optimizer_offload.buffer_bytes = static_cast<size_t>(c.offload.buffer_mb) << 20;
    }
    if (c.offload.params == OffloadDevice::NVMe) o.param_offload.dir = c.offload.dir;
    // Note [State on the host]: on a GPU any offload keeps the masters, their gradients and
    // the optimizer's state on the host; cpu on the CPU, where they are already, moves nothing.
    o.state_on_host = c.offload.any() && !device_.is_cpu();
    for (auto [device, what, flag] :
         {std::tuple{c.offload.optimizer, "the optimizer's state is", "--offload-optimizer"},
          std::tuple{c.offload.params, "the parameter shards are", "--offload-params"}}) {
      if (device != OffloadDevice::CPU || comm_->rank() != 0) continue;
      if (device_.is_cpu()) {
        log::info(flag, " cpu: this run computes on the CPU, where ", what,
                  " in host memory already; nothing moves");
      } else if (c.offload.optimizer == OffloadDevice::None) {
        log::info(flag,
                  " cpu: the optimizer's state goes to the host with the parameter "
                  "shards, and the optimizer steps there");
      }
    }
    sharded_ = zero::shard(
        model_, shards_, o,
        [&](std::vector<torch::Tensor> p) { return make_optimizer(c.optimizer, std::move(p)); },
        hybrid_.replicate);
    scaling_.set_optimizer(&sharded_->optimizer());
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

  torch::Tensor step(double max_norm) override {
    const at::Tensor found_inf = scaling_.check_and_unscale(sharded_->gradient_shards());
    zero::NormScope scope;
    if (pp_.pipeline) {  // the norm of every stage's shards, a tied parameter counted once
      scope.across = &pp_.pipeline->group();
      scope.counted_elsewhere = pp_.pipeline->counted_elsewhere();
    }
    torch::Tensor norm = max_norm > 0 ? sharded_->clip_grad_norm(max_norm, scope) : torch::Tensor();
    sharded_->step(found_inf);
    sharded_->zero_grad();
    return norm;
  }

  std::shared_ptr<void> whole_parameters() override {
    return std::make_shared<zero::ShardedModel::FullParams>(sharded_.get());
  }

  void each_whole_parameter(const checkpoint::TakeTensor& take) override {
    sharded_->each_whole_parameter(
        [&](size_t i, const at::Tensor& whole) { take(sharded_->param_names()[i], whole); });
  }

  SaveJob stage(const std::string& out, const checkpoint::CheckpointData& data, int keep,
                bool background) override {
    scaling_.settle();  // the last step's outcome, before its optimizer state is read
    const std::string dir = out + stage_folder_ + tp_folder_;
    checkpoint::ShardedCheckpointData d;
    d.epoch = data.epoch;
    d.global_step = data.global_step;
    d.metadata_json = scaling_.with_state(data.metadata_json);
    d.layouts = unit_layouts();
    // In the background, copies in host memory (Note [Checkpoints in the background]), or on
    // disk for state kept there (Note [Optimizer state on disk]).
    std::vector<zero::ShardSlice> slices = sharded_->checkpoint_slices();
    if (hybrid_.replicate) {  // each replica writes its part (Note [Hybrid sharding])
      slices = zero::replica_part(slices, hybrid_.replicate->rank(), hybrid_.replicate->size());
    }
    const auto on_disk = background ? sharded_->snapshot_state_on_disk() : nullptr;
    auto kept = [&](const torch::Tensor& t) {
      if (!background) return t;
      const at::Tensor copy = on_disk ? on_disk(t) : at::Tensor();
      return copy.defined() ? copy : checkpoint::host_snapshot(t);
    };
    std::vector<checkpoint::ShardPiece> mine;
    for (auto& s : slices)
      mine.push_back({s.key, s.full_numel, s.begin, kept(s.data)});
    std::vector<std::pair<std::string, torch::Tensor>> full;
    for (const auto& b : model_->named_buffers())
      full.emplace_back("buffer/" + b.key(), kept(b.value()));
    full.emplace_back("optim/step", torch::tensor({sharded_->optimizer_steps()}, torch::kLong));
    full.emplace_back("rng_state", models::cpu_generator_state());
    // Rank 0's files beside the step folders: the pipeline's layout, and how each parameter is
    // split across the tp folders (for `dtorch checkpoint consolidate`).
    const bool layout = pp_.pipeline && pp_.stage() == 0 && comm_->rank() == 0;
    std::vector<std::string> folders;
    if (layout)
      folders = checkpoint::folders_by_rank(static_cast<int>(pp_.plan.stages.size()),
                                            pp_.pipeline->group().size());
    std::string split_json;
    if (tp_ && tp_->group()->rank() == 0 && comm_->rank() == 0) {
      nlohmann::json spec = {{"tp", tp_->group()->size()}, {"sharded", nlohmann::json::object()}};
      for (const auto& [name, split] : tp_->sharded())
        spec["sharded"][name] = {{"dim", split.dim}, {"fused", split.fused}};
      split_json = spec.dump() + "\n";
    }
    return [out, dir, d, mine = std::move(mine), full = std::move(full), keep, layout,
            model = c_.model, plan = pp_.plan, folders, split_json,
            split_path = out + stage_folder_ + "/tensor_parallel.json"](comm::Communicator& group) {
      checkpoint::save_sharded_checkpoint(dir, d, mine, full, group, keep);
      if (layout) checkpoint::write_pipeline_layout(out, model, plan, folders);
      if (!split_json.empty())
        checkpoint::write_file_atomically(split_path,
                                          std::vector<char>(split_json.begin(), split_json.end()));
    };
  }

  comm::Communicator& save_group() override { return *comm_; }

  // Note [Resharding by name]: whatever units and stages wrote the shards, each of this
  // rank's slices is read by parameter name, so ZeRO resumes at any --pp, schedule, dp size
  // and wrap policy (the same --tp: Note [Tensor-parallel checkpoints]).
  std::optional<checkpoint::LoadedCheckpoint> load_latest(const std::string& run_dir) override {
    // Note [Pipeline checkpoints]: a rank's shards hold all of its stages, in the folder of
    // the first; pipeline.json names, for every stage, the folder that holds it.
    const std::vector<std::string> stages = checkpoint::folders_holding(run_dir, model_->units());
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
    checkpoint::LoadedCheckpoint out{checkpoint::checkpoint_data(saved->data()), saved->dir()};
    scaling_.restore(c_.precision, out.data.metadata_json);
    return out;
  }

  zero::MemoryStats memory() const override { return sharded_->memory(); }
  zero::WaitSeconds comm_waits() const override { return sharded_->wait_seconds(); }

  parallel::AutocastMode autocast() const override { return autocast_of(c_.precision, device_); }
  double loss_scale() const override { return scaling_.scale(); }
  int64_t skipped_steps() const override { return scaling_.skipped(); }
  at::Device device() const override { return device_; }
  void set_lr(double lr) override { set_lr_of(sharded_->optimizer(), lr); }

  std::string describe() const override {
    std::string more;  // what this run adds to the strategy
    if (const auto* o = sharded_->optimizer_offload()) {
      // KiB below a MiB: a small model's buffers are its largest shard's size.
      auto size = [](int64_t bytes) {
        return bytes < (1 << 20) ? str(bytes >> 10, " KiB")
                                 : str(std::round(bytes * 10.0 / (1 << 20)) / 10, " MiB");
      };
      more = str(", optimizer state on disk in ", c_.offload.dir, " (", size(o->file_bytes()),
                 " a rank, through ", c_.offload.buffers, " buffers of ", size(o->buffer_bytes()),
                 ")");
    }
    if (c_.offload.params == OffloadDevice::NVMe) more += ", parameter shards on disk there too";
    if (sharded_->options().state_on_host) more += ", stepped on the host";
    if (hybrid_.replicate) {  // Note [Hybrid sharding]
      more += str(", sharded over ", shards_->size(), " ranks in each of ",
                  hybrid_.replicate->size(), " replicas");
    }
    return str(name_of(c_.kind), " (", sharded_->plan().units.size(), " units), ",
               name_of(c_.precision.compute), " compute, ", name_of(c_.precision.reduce_dtype),
               " gradient reduction, on ", device_, more);
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
  // Every data-parallel rank (checkpoints are written over it); the shards spread over shards_,
  // which is comm_ itself without hybrid sharding.
  std::shared_ptr<comm::Communicator> comm_;
  HybridSharding hybrid_;
  std::shared_ptr<comm::Communicator> shards_;
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

std::unique_ptr<Strategy> make_zero_strategy(const StrategyConfig& c,
                                             std::shared_ptr<models::Model> model,
                                             std::shared_ptr<comm::Communicator> comm,
                                             TensorParallelism tp, PipelineParallelism pp,
                                             HybridSharding hybrid) {
  return std::make_unique<ZeroStrategy>(c, std::move(model), std::move(comm), tp, std::move(pp),
                                        std::move(hybrid));
}

}  // namespace strategy
}  // namespace dtorch::train
