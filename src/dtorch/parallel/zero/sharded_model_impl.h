// ShardedModel::Impl: the state of a sharded model (its units, their shards and buffers, the
// optimizer over the shards) that the files implementing it share: sharded_model.cpp (the public
// API), sharded_model_build.cpp (packing the model into units), sharded_model_gather.cpp
// (gathering and releasing stage 3's units) and sharded_model_reduce.cpp (reducing gradients).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/grad_ready.h"
#include "dtorch/parallel/zero/offload.h"
#include "dtorch/parallel/zero/param_offload.h"
#include "dtorch/parallel/zero/zero.h"

namespace dtorch::zero {

inline int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

// Note [Spare unit memory]: a gathered unit's memory and a stage 3 unit's gradient bucket are the
// same sizes every step (every block of a GPT is), and with the allocator returning large buffers
// to the kernel (Note [Returning released memory]) each gather and each bucket page-faulted its
// memory in afresh: gpt-small at 2 ranks gathers 24 and buckets 12 units of 28 MiB a step. The
// most recently released of each are kept and handed to the next of the same size instead.
// gpt-small at 2 ranks (LibTorch 2.15, 4 steps, interleaved runs): 0.51-0.53 samples/s without,
// 0.63-0.70 with two kept; peak RSS per rank 2.17-2.18 and 2.25-2.26 GiB. Two still left about
// three units' memory to fault in every step (the root unit, of another size, pushed a block's
// out): with four kept, gpt-small at 2 ranks (LibTorch 2.15, 3 steps after 3) faults 0 pages a
// step where it faulted 20.8k, and steps in 1.39 s where it took 1.70 s; peak RSS per rank 2.30
// GiB with either.
//
// Spares holds the four most recently released buffers (unit memory, or gradient buckets),
// each with its size in bytes. Impl holds two.
template <class T>
class Spares {
 public:
  void put(size_t nbytes, T buffer) {
    kept_.emplace_back(nbytes, std::move(buffer));
    if (kept_.size() > 4) kept_.pop_front();
  }
  /// A kept buffer of `nbytes`, or an empty T when there is none.
  T take(size_t nbytes) {
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first != nbytes) continue;
      T buffer = std::move(it->second);
      kept_.erase(it);
      return buffer;
    }
    return T();
  }

 private:
  std::deque<std::pair<size_t, T>> kept_;
};

struct ShardedModel::Impl {
  struct UnitState {
    at::Tensor full;        // [padded], param dtype; the parameters are views of it
    at::Tensor master;      // [shard] fp32: the optimizer's parameter
    at::Tensor grad_shard;  // [shard] fp32: the master's gradient
    at::Tensor grad_full;   // stage 1: [padded], param dtype; .grad of the parameters alias it
    at::Tensor bucket;      // stages 2-3, during backward: gradients to reduce (reduce dtype)
    at::Tensor incoming;    // stages 2-3, during backward: this rank's reduced chunk
    at::Tensor landed;      // state on the host: a reduced chunk copied there, to add
    comm::Work reduce, gather;
    bool materialized = true;
    bool shard_zeroed = true;    // grad_shard holds zeros: a reduction may write it directly
    bool land_in_shard = false;  // state on the host: the reduced chunk overwrites grad_shard
  };

  std::shared_ptr<torch::nn::Module> module;
  models::Model* model = nullptr;  // set when the module has blocks (stage 3 hooks)
  std::shared_ptr<comm::Communicator> comm;
  // Note [Hybrid sharding]: the ranks holding this rank's shards in the other replicas; null
  // without.
  std::shared_ptr<comm::Communicator> replicas;
  Options opts;
  ShardPlan plan;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor> params, buffers;
  at::Device device = at::kCPU;  // where the parameters are, and every buffer made for them
  std::vector<UnitState> units;
  // Stages 2-3: units whose reduce-scatter is launched and not yet added to the shard, oldest
  // first (Note [Buckets in flight]).
  std::deque<size_t> in_flight;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<OptimizerOffload> offload;     // after the optimizer: it holds its state
  std::unique_ptr<ParamOffload> params_on_disk;  // the masters' file (Note [Parameters on disk])
  std::map<std::string, std::pair<size_t, bool>> block_first, block_last;  // block -> unit
  // Reduces units as backward completes them (Note [Gradient readiness]); made last in
  // build(), reset first on destruction.
  std::unique_ptr<parallel::GradReadiness> readiness;
  bool keep_gathered = false;
  // Note [ZeRO-3 under a pipeline]: the units stay gathered; or, each unit is released when
  // backward enters the next one (left_in_backward: the unit it entered last).
  bool hold_for_microbatches = false;
  bool release_in_backward = false;
  size_t left_in_backward = 0;
  bool root_per_step = false;  // the model scopes its forward: the root is gathered per step
  int64_t gathered_bytes = 0, peak_gathered_bytes = 0;
  WaitSeconds waited;
  Spares<at::DataPtr> spare_memory;  // Note [Spare unit memory]
  Spares<at::Tensor> spare_buckets;

  int rank() const { return comm->rank(); }
  at::TensorOptions on(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(device);
  }
  // Note [State on the host]: where the masters, their gradients and the optimizer's state
  // live; pinned on the host for a model on a GPU, so that copies to and from it run
  // asynchronously.
  at::TensorOptions on_state(at::ScalarType dtype) const {
    if (!opts.state_on_host) return on(dtype);
    return at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda());
  }
  bool async_copies() const { return opts.state_on_host && device.is_cuda(); }
  bool sharded_params() const { return opts.stage == 3; }
  // Stage 3's gradient buckets on a CPU live in mappings of their own, two of them kept (Note
  // [Spare unit memory]); a GPU's caching allocator keeps freed memory itself.
  bool mapped_buckets() const { return sharded_params() && device.is_cpu(); }
  // The root of a model that does not scope its forward (Note [Sharding stages]).
  bool always_gathered(size_t u) const {
    return sharded_params() && !root_per_step && plan.units[u].name == "root";
  }
  at::Tensor own(const at::Tensor& flat, size_t u) const {
    return flat.narrow(0, rank() * plan.units[u].shard, plan.units[u].shard);
  }

  void build(const OptimizerFactory& make_optimizer);
  // Note [Hybrid sharding]: rank 0's `t` to every rank, through the replicas and then comm.
  void broadcast_from_first(at::Tensor& t, const std::string& what);
  void broadcast_from_first(const std::vector<at::Tensor>& ts, const std::string& what);
  // Note [Hybrid sharding]: averages this rank's reduced chunk of a unit across the replicas.
  void average_across_replicas(at::Tensor& chunk, const std::string& what);
  void init_deferred(const models::Model& m);
  void publish();
  void publish_unit(size_t u);
  void step_by_unit(const at::Tensor& skip, const std::function<void(size_t)>& stepped);
  void install_block_hooks();
  void warn_no_units(const std::vector<ParamInfo>& infos) const;
  void install_readiness();
  void absorb(size_t i);
  void launch(size_t u);
  void wait_reductions();
  void finish_reduction(UnitState& s);
  void complete_reduction();
  void land();
  void gather_async(size_t u);
  void ensure_gathered(size_t u);
  void release(size_t u);
  void wait_for(comm::Work& w, double& seconds);
  at::Tensor zeroed_bucket(size_t u);
  bool owns_whole_unit(const at::Tensor& g, size_t u) const;
  void before_block(const std::string& block);
  at::Tensor after_block(const std::string& block, at::Tensor out);
  void before_forward();
  at::Tensor after_forward(at::Tensor out);
  void before_unit_backward(size_t u);
  // Note [Parameters on disk]: master u leaves memory after its use.
  void evict_master(size_t u) {
    if (params_on_disk) params_on_disk->evict(u);
  }
};

}  // namespace dtorch::zero
