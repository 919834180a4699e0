// ddp::wrap: checks that all ranks hold the same model, makes their weights identical, and
// hands the parameters to a Reducer that averages gradients during backward.
#include "dtorch/parallel/ddp/ddp.h"

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/parallel/ddp/reducer.h"

namespace dtorch::ddp {
namespace {

std::string signature_line(const std::string& name, const at::Tensor& t) {
  return str(name, " ", t.sizes(), " ", t.scalar_type());
}

// Every rank compares its parameter list with rank 0's; all ranks learn which ranks differ,
// so they fail together instead of leaving rank 0 waiting in the next collective.
void check_same_model(const torch::nn::Module& model, comm::Communicator& comm) {
  std::vector<std::string> mine;
  std::string joined;
  for (const auto& kv : model.named_parameters()) {
    mine.push_back(signature_line(kv.key(), kv.value()));
    joined += mine.back() + "\n";
  }
  std::string root = comm.broadcast_string(joined, 0, "DDP model check");
  std::vector<std::string> theirs;
  std::istringstream in(root);
  for (std::string line; std::getline(in, line);)
    theirs.push_back(line);

  std::string diff;
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()) && diff.empty(); ++i) {
    std::string a = i < theirs.size() ? theirs[i] : "(nothing)";
    std::string b = i < mine.size() ? mine[i] : "(nothing)";
    if (a != b) {
      diff = str("parameter #", i, ": rank 0 has ", a, ", rank ", comm.rank(), " has ", b);
    }
  }
  at::Tensor differs = at::zeros({comm.size()}, at::kInt);
  differs[comm.rank()] = diff.empty() ? 0 : 1;
  comm.allreduce(differs, comm::ReduceOp::Sum, "DDP model check");
  DTORCH_CHECK_T(ConfigError, diff.empty(), "DDP: the model differs between ranks: ", diff,
                 " (every rank must build the same model, with the same parameter names, "
                 "shapes and dtypes, before ddp::wrap)");
  std::string bad;
  for (int r = 0; r < comm.size(); ++r) {
    if (differs[r].item<int>()) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  }
  DTORCH_CHECK_T(ConfigError, bad.empty(), "DDP: rank(s) ", bad,
                 " built a model that differs from rank 0's (their error names the first "
                 "differing parameter)");
}

// One broadcast per dtype instead of one per tensor: a model has hundreds of small tensors.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm) {
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> flat;
    for (auto& t : group)
      flat.push_back(t.reshape({-1}));
    at::Tensor all = at::cat(flat);
    comm.broadcast(all, 0, "DDP initial weights");
    int64_t off = 0;
    for (auto& t : group) {
      t.copy_(all.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

}  // namespace

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
  torch::NoGradGuard no_grad;
  if (comm_->size() > 1) {
    check_same_model(*model_, *comm_);
    std::vector<at::Tensor> state;
    for (auto& p : model_->parameters())
      state.push_back(p.detach());
    for (auto& b : model_->buffers())
      state.push_back(b);
    broadcast_from_rank0(state, *comm_);
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
