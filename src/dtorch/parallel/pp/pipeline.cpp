// The pipeline executor of Note [Pipeline execution].
#include "dtorch/parallel/pp/pipeline.h"

#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/parallel/grad_clip.h"
#include "dtorch/parallel/pp/split_backward.h"

namespace dtorch::pp {
namespace {

enum MessageKind { kActivation = 0, kGradient = 1, kHeader = 2 };
constexpr int kMaxMicrobatches = 1 << 12;
constexpr int kHeaderLength = 10;  // ndim, dtype, up to 8 dims

/// Tag of the message stage `from` sends about micro-batch `mb`.
int tag(int from, MessageKind kind, int mb) {
  return ((from * 3 + kind) << 12) | mb;
}

std::vector<int64_t> key_of(const at::Tensor& t) {
  return t.sizes().vec();
}

}  // namespace

struct Pipeline::Impl {
  struct Slot {
    at::Tensor input, output, loss, input_grad, output_grad;
    SplitBackward split;
    bool split_pending = false;  // B ran, W has not
  };
  std::map<std::pair<int, int>, Slot> slots;  // (stage, micro-batch)
  struct Pending {
    comm::Work work;
    at::Tensor keep;
  };
  std::vector<Pending> sends;
  /// Per stage boundary (the sending stage): micro-batch shapes whose header was sent, and
  /// on the receiving side the activation shape and dtype each one gives.
  std::map<int, std::set<std::vector<int64_t>>> headers_sent;
  std::map<std::pair<int, std::vector<int64_t>>, std::pair<std::vector<int64_t>, at::ScalarType>>
      shapes;
  struct Tied {
    std::shared_ptr<comm::Communicator> group;
    std::vector<at::Tensor> params;
  };
  std::vector<Tied> tied;
  /// Parameters this rank counts in the gradient norm: its own, and tied ones where it is the
  /// first holder.
  std::vector<at::Tensor> norm_params;
  std::set<std::string> counted_elsewhere;  // the names of the others
  comm::Communicator* pp = nullptr;

  void send(const at::Tensor& t, int to_stage, int t_tag) {
    at::Tensor c = t.contiguous();
    sends.push_back({pp->isend(c, rank_of_stage(to_stage, pp->size()), t_tag), c});
  }
  void wait_sends() {
    for (auto& p : sends)
      p.work.wait();
    sends.clear();
  }
  /// Stage s's input for micro-batch mb (of input shape `key`) from stage s - 1.
  at::Tensor recv_activation(int s, int mb, const std::vector<int64_t>& key, at::Device device) {
    const int from = rank_of_stage(s - 1, pp->size());
    auto known = shapes.find({s, key});
    if (known == shapes.end()) {
      at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
      pp->recv(header, from, tag(s - 1, kHeader, mb));
      auto h = header.accessor<int64_t, 1>();
      std::vector<int64_t> dims(h.data() + 2, h.data() + 2 + h[0]);
      known = shapes
                  .emplace(std::make_pair(s, key),
                           std::make_pair(dims, static_cast<at::ScalarType>(h[1])))
                  .first;
    }
    at::Tensor buf =
        at::empty(known->second.first, at::TensorOptions(known->second.second).device(device));
    pp->recv(buf, from, tag(s - 1, kActivation, mb));
    return buf;
  }
  /// Stage s's output for micro-batch mb to stage s + 1, after a header the first time.
  void send_activation(const at::Tensor& out, int s, int mb, const std::vector<int64_t>& key) {
    DTORCH_CHECK(out.dim() <= kHeaderLength - 2, "pipeline activations have at most ",
                 kHeaderLength - 2, " dimensions; stage ", s, " gives ", out.dim());
    if (headers_sent[s].insert(key).second) {
      at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
      header[0] = out.dim();
      header[1] = static_cast<int64_t>(out.scalar_type());
      for (int64_t d = 0; d < out.dim(); ++d)
        header[2 + d] = out.size(d);
      send(header, s + 1, tag(s, kHeader, mb));
    }
    send(out.detach(), s + 1, tag(s, kActivation, mb));
  }
};

Pipeline::Pipeline(std::vector<std::shared_ptr<models::Model>> stages,
                   std::shared_ptr<comm::Communicator> pp, PipelineOptions opts)
    : stages_(std::move(stages)),
      pp_(std::move(pp)),
      opts_(std::move(opts)),
      impl_(std::make_unique<Impl>()) {
  impl_->pp = pp_.get();
  const int ranks = pp_->size(), rank = pp_->rank();
  const int v =
      opts_.virtual_stages > 0 ? opts_.virtual_stages : default_virtual_stages(opts_.schedule);
  DTORCH_CHECK_T(ConfigError, opts_.microbatches >= 1 && opts_.microbatches <= kMaxMicrobatches,
                 "--microbatches ", opts_.microbatches, " must be between 1 and ",
                 kMaxMicrobatches);
  DTORCH_CHECK_T(ConfigError, static_cast<int>(stages_.size()) == v, "rank ", rank, " holds ",
                 stages_.size(), " pipeline stages but the schedule runs ", v, " per rank");
  schedule_ = make_schedule(opts_.schedule, ranks, opts_.microbatches, v);
  simulate(schedule_, opts_.microbatches);  // refuses a broken schedule before anything runs
  num_stages_ = ranks * v;

  // Parameters several stages hold (by name): one group per set of holders.
  std::string mine;
  for (const auto& s : stages_)
    for (const auto& kv : s->named_parameters())
      mine += kv.key() + "\n";
  std::map<std::string, std::vector<int>> holders;
  for (int r = 0; r < ranks; ++r) {
    std::stringstream in(ranks == 1 ? mine : pp_->broadcast_string(mine, r, "pipeline names"));
    for (std::string name; std::getline(in, name);)
      if (holders[name].empty() || holders[name].back() != r) holders[name].push_back(r);
  }
  std::map<std::vector<int>, std::vector<std::string>> groups;
  for (const auto& [name, ranks_holding] : holders)
    if (ranks_holding.size() > 1) groups[ranks_holding].push_back(name);
  int index = 0;
  for (const auto& [members, names] : groups) {
    ++index;
    if (std::find(members.begin(), members.end(), rank) == members.end()) continue;
    Impl::Tied t;
    t.group = pp_->split(members, str("tied", index));
    for (const auto& name : names)
      for (const auto& s : stages_) {
        const auto params = s->named_parameters();  // find() points into it: keep it alive
        if (const auto* p = params.find(name)) t.params.push_back(*p);
      }
    if (t.group->rank() != 0) impl_->counted_elsewhere.insert(names.begin(), names.end());
    impl_->tied.push_back(std::move(t));
  }
  std::set<const at::TensorImpl*> counted_elsewhere;
  for (const auto& t : impl_->tied)
    if (t.group->rank() != 0)
      for (const auto& p : t.params)
        counted_elsewhere.insert(p.unsafeGetTensorImpl());
  for (const auto& s : stages_)
    for (const auto& p : s->parameters())
      if (!counted_elsewhere.count(p.unsafeGetTensorImpl())) impl_->norm_params.push_back(p);
}

void Pipeline::forward_only(const at::Tensor& inputs, const at::Tensor& targets,
                            const OutputObserver& observe) {
  torch::NoGradGuard no_grad;
  const int ranks = pp_->size(), rank = pp_->rank();
  const int chunks = static_cast<int>(std::min<int64_t>(opts_.microbatches, inputs.size(0)));
  auto mb_inputs = inputs.chunk(chunks), mb_targets = targets.chunk(chunks);
  Impl& im = *impl_;
  // Micro-batch by micro-batch, each through this rank's stages in order: every forward
  // waits only on earlier stages of the same or earlier micro-batches.
  for (size_t mb = 0; mb < mb_inputs.size(); ++mb) {
    const std::vector<int64_t> key = key_of(mb_inputs[mb]);
    for (size_t k = 0; k < stages_.size(); ++k) {
      const int s = rank + static_cast<int>(k) * ranks, m = static_cast<int>(mb);
      at::Tensor x = s == 0 ? mb_inputs[mb] : im.recv_activation(s, m, key, device());
      at::Tensor out = stages_[k]->forward(x);
      if (s == num_stages_ - 1) {
        if (observe) observe(out, mb_targets[mb]);
      } else {
        im.send_activation(out, s, m, key);
      }
    }
  }
  im.wait_sends();
}

at::Tensor Pipeline::clip_grad_norm(double max_norm) {
  std::vector<at::Tensor> counted, all;
  for (const auto& p : impl_->norm_params)
    counted.push_back(p.grad());
  for (const auto& s : stages_)
    for (const auto& p : s->parameters())
      all.push_back(p.grad());
  at::Tensor sq = parallel::sum_of_squares(counted, device());
  pp_->allreduce(sq, comm::ReduceOp::Sum, "pipeline gradient norm");
  return parallel::clip_to_norm(all, sq, max_norm);  // Note [Clipping on the device]
}

const std::set<std::string>& Pipeline::counted_elsewhere() const {
  return impl_->counted_elsewhere;
}

Pipeline::~Pipeline() = default;

at::Device Pipeline::device() const {
  for (const auto& s : stages_)
    for (const auto& p : s->parameters())
      return p.device();
  return at::kCPU;
}

bool Pipeline::holds_last_stage() const {
  return rank_of_stage(num_stages_ - 1, pp_->size()) == pp_->rank();
}

PipelineStepResult Pipeline::step(const at::Tensor& inputs, const at::Tensor& targets,
                                  const PipelineLoss& loss_fn, const OutputObserver& observe) {
  const int M = opts_.microbatches, ranks = pp_->size(), rank = pp_->rank();
  const int64_t batch = inputs.size(0);
  DTORCH_CHECK_T(ConfigError, batch >= M, "a batch of ", batch, " samples cannot be cut into ", M,
                 " micro-batches: raise the batch size or lower --microbatches");
  auto mb_inputs = inputs.chunk(M), mb_targets = targets.chunk(M);
  DTORCH_CHECK_T(ConfigError, static_cast<int>(mb_inputs.size()) == M, "a batch of ", batch,
                 " samples cuts into ", mb_inputs.size(), " micro-batches, not ", M,
                 ": use a batch size divisible by --microbatches");
  Impl& im = *impl_;
  PipelineStepResult result;
  int live = 0;
  auto local = [&](int stage) -> models::Model& { return *stages_[stage / ranks]; };
  auto params = [&](int stage) {
    std::vector<at::Tensor> p;
    for (const auto& t : local(stage).parameters())
      if (t.requires_grad()) p.push_back(t);
    return p;
  };
  auto send = [&](const at::Tensor& t, int to_stage, int t_tag) { im.send(t, to_stage, t_tag); };

  using Clock = std::chrono::steady_clock;
  const auto step_start = Clock::now();
  for (const Action& a : schedule_[rank]) {
    const int s = a.stage, mb = a.microbatch;
    const auto action_start = Clock::now();
    Impl::Slot& slot = im.slots[{s, mb}];
    const std::vector<int64_t> key = key_of(mb_inputs[mb]);
    switch (a.kind) {
      case ActionKind::RecvActivation: {
        at::Tensor buf = im.recv_activation(s, mb, key, device());
        slot.input = buf.is_floating_point() ? buf.requires_grad_(true) : buf;
        break;
      }
      case ActionKind::Forward: {
        at::Tensor x = s == 0 ? mb_inputs[mb] : slot.input;
        at::Tensor out = local(s).forward(x);
        ++live;
        result.peak_activations = std::max(result.peak_activations, live);
        if (s == num_stages_ - 1) {
          const double weight = double(mb_inputs[mb].size(0)) / double(batch);
          slot.loss = loss_fn(out, mb_targets[mb]) * weight;
          result.loss += slot.loss.item<double>();
          result.has_loss = true;
          if (observe) observe(out.detach(), mb_targets[mb]);
        } else {
          slot.output = out;
        }
        break;
      }
      case ActionKind::SendActivation: {
        im.send_activation(slot.output, s, mb, key);
        break;
      }
      case ActionKind::RecvGrad: {
        slot.output_grad = at::empty_like(slot.output, at::MemoryFormat::Contiguous);
        pp_->recv(slot.output_grad, rank_of_stage(s + 1, ranks), tag(s + 1, kGradient, mb));
        break;
      }
      case ActionKind::Backward: {
        const bool last = s == num_stages_ - 1;
        if (last) {
          torch::autograd::backward({slot.loss});
        } else {
          torch::autograd::backward({slot.output}, {slot.output_grad});
        }
        --live;
        if (s == 0) {
          im.slots.erase({s, mb});
        } else {
          slot.input_grad = slot.input.grad();
          slot.output = slot.loss = slot.output_grad = slot.input = at::Tensor();
        }
        break;
      }
      case ActionKind::BackwardInput: {
        const bool last = s == num_stages_ - 1;
        auto [split, input_grad] = SplitBackward::input_gradient(
            last ? slot.loss : slot.output, last ? at::Tensor() : slot.output_grad,
            s > 0 ? slot.input : at::Tensor(), params(s));
        slot.split = std::move(split);
        slot.split_pending = true;
        slot.input_grad = input_grad;
        break;
      }
      case ActionKind::BackwardWeight: {
        slot.split.weights();
        im.slots.erase({s, mb});
        --live;
        break;
      }
      case ActionKind::SendGrad: {
        DTORCH_CHECK(slot.input_grad.defined(), "stage ", s, " has no input gradient for ",
                     "micro-batch ", mb, ": its input does not reach its output");
        send(slot.input_grad, s - 1, tag(s, kGradient, mb));
        if (slot.split_pending) {
          slot.input_grad = at::Tensor();
        } else {
          im.slots.erase({s, mb});
        }
        break;
      }
    }
    if (is_compute(a.kind))
      result.compute_seconds += std::chrono::duration<double>(Clock::now() - action_start).count();
  }
  im.wait_sends();
  im.slots.clear();
  result.seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
  for (auto& t : im.tied) {
    std::vector<at::Tensor> grads;
    for (auto& p : t.params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad().flatten());
    }
    at::Tensor flat = at::cat(grads);
    t.group->allreduce(flat, comm::ReduceOp::Sum, "tied parameter gradients");
    int64_t offset = 0;
    for (auto& p : t.params) {
      p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  return result;
}

}  // namespace dtorch::pp
