// Making every rank's replica of a model the same before parallel training starts: a check
// that all ranks built the same model, and a coalesced broadcast of rank 0's weights.
#include "dtorch/parallel/model_sync.h"

#include "dtorch/core/error.h"

namespace dtorch::parallel {
namespace {

std::string signature_line(const std::string& name, const at::Tensor& t) {
  return str(name, " ", t.sizes(), " ", t.scalar_type());
}

}  // namespace

// Every rank compares its parameter list with rank 0's; all ranks learn which ranks differ,
// so they fail together instead of leaving rank 0 waiting in the next collective.
void check_same_model(const torch::nn::Module& model, comm::Communicator& comm,
                      const std::string& who) {
  std::vector<std::string> mine;
  std::string joined;
  for (const auto& kv : model.named_parameters()) {
    mine.push_back(signature_line(kv.key(), kv.value()));
    joined += mine.back() + "\n";
  }
  std::string root = comm.broadcast_string(joined, 0, who + " model check");
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
  comm.allreduce(differs, comm::ReduceOp::Sum, who + " model check");
  DTORCH_CHECK_T(ConfigError, diff.empty(), who, ": the model differs between ranks: ", diff,
                 " (every rank must build the same model, with the same parameter names, "
                 "shapes and dtypes, before applying ",
                 who, ")");
  std::string bad;
  for (int r = 0; r < comm.size(); ++r) {
    if (differs[r].item<int>()) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  }
  DTORCH_CHECK_T(ConfigError, bad.empty(), who, ": rank(s) ", bad,
                 " built a model that differs from rank 0's (their error names the first "
                 "differing parameter)");
}

// One broadcast per dtype instead of one per tensor: a model has hundreds of small tensors.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm,
                          const std::string& what) {
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> flat;
    for (auto& t : group)
      flat.push_back(t.reshape({-1}));
    at::Tensor all = at::cat(flat);
    comm.broadcast(all, 0, what);
    int64_t off = 0;
    for (auto& t : group) {
      t.copy_(all.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

}  // namespace dtorch::parallel
