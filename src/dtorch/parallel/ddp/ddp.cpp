// ddp::wrap: checks that all ranks hold the same model, makes their weights identical, and
// hands the parameters to a Reducer that averages gradients during backward.
#include "dtorch/parallel/ddp/ddp.h"

#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/core/log.h"
#include "dtorch/models/model.h"
#include "dtorch/parallel/ddp/reducer.h"
#include "dtorch/parallel/model_sync.h"

namespace dtorch::ddp {

const NameTable<Compression>& names(Compression) {
  static const NameTable<Compression> n{
      {Compression::None, "none"}, {Compression::FP16, "fp16"}, {Compression::BF16, "bf16"}};
  return n;
}

DistributedDataParallel::NoSync::NoSync(Reducer* r) : r_(r) {
  DTORCH_CHECK(r_->sync(), "no_sync() guards must not nest");
  r_->set_sync(false);
}

DistributedDataParallel::NoSync::~NoSync() {
  if (r_) r_->set_sync(true);
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> model,
                                                 std::shared_ptr<comm::Communicator> comm,
                                                 Options opts)
    : model_(std::move(model)), comm_(std::move(comm)), opts_(opts) {
  DTORCH_CHECK(model_ && comm_, "ddp::wrap needs a model and a communicator");
  models::require_memory(*model_, "DDP");
  set_freed_memory(FreedMemory::Reuse);  // Note [Returning released memory]
  torch::NoGradGuard no_grad;
  if (comm_->size() > 1) {
    parallel::check_same_model(*model_, *comm_, "DDP");
    std::vector<at::Tensor> state;
    for (auto& p : model_->parameters())
      state.push_back(p.detach());
    for (auto& b : model_->buffers())
      state.push_back(b);
    parallel::broadcast_from_rank0(state, *comm_, "DDP initial weights");
  }
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& kv : model_->named_parameters()) {
    if (!kv.value().requires_grad()) continue;
    params.push_back(kv.value());
    names.push_back(kv.key());
  }
  std::vector<at::Tensor> buffers = model_->buffers();
  if (comm_->size() == 1) buffers.clear();
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), std::move(buffers),
                                       comm_, opts_);
  if (comm_->rank() == 0) {
    log::debug("DDP: ", reducer_->plan().buckets.size(), " gradient buckets over ", comm_->size(),
               " ranks");
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() {
  return NoSync(reducer_.get());
}

void DistributedDataParallel::reduce_accumulated() {
  reducer_->reduce_accumulated();
}

const BucketPlan& DistributedDataParallel::plan() const {
  return reducer_->plan();
}

double DistributedDataParallel::comm_wait_seconds() const {
  return reducer_->comm_wait_seconds();
}

std::shared_ptr<DistributedDataParallel> wrap(std::shared_ptr<torch::nn::Module> model,
                                              std::shared_ptr<comm::Communicator> comm,
                                              Options opts) {
  return std::make_shared<DistributedDataParallel>(std::move(model), std::move(comm), opts);
}

}  // namespace dtorch::ddp
