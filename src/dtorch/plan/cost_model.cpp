// Note [Cost model]: the terms, the layouts they are summed for, and the ranking.
#include "dtorch/plan/cost_model.h"

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dtorch/core/allocation_meter.h"
#include "dtorch/core/error.h"
#include "dtorch/models/module_hooks.h"
#include "dtorch/models/registry.h"
#include "dtorch/parallel/cp/context_parallel.h"
#include "dtorch/parallel/pp/stage_plan.h"
#include "dtorch/parallel/replicas.h"
#include "dtorch/parallel/zero/offload.h"
#include "dtorch/parallel/zero/zero.h"
#include "dtorch/report/out_of_memory.h"

namespace dtorch::plan {
namespace {

// What one rank runs of the model: its stages' units, and the most micro-batches of
// activations it holds at once.
struct RankShare {
  int64_t parameters = 0;  // before tensor parallelism's split; the tied embedding once
  int blocks = 0;
  bool embedding = false, head = false;
  int stages = 1;          // stages per rank (interleaved: 2)
  std::vector<int> units;  // the model's units it holds, in order
  double work = 0;         // its forward's (forward_work)
};

// A unit's forward work, to find the slowest stage: a measured unit's FLOPs; a transformer's in
// units of a block, where a GPT's head's matmul is 2 V / (8 C + 4 M) blocks' worth (V / 12 C at
// M = 4 C), a ViT's (its class token's) none to speak of.
double forward_work(const Workload& w, int unit) {
  if (w.measured()) return w.unit_work[unit].conv_flops + w.unit_work[unit].matmul_flops;
  const int head_unit = static_cast<int>(w.unit_parameters.size()) - 1;
  if (unit == head_unit) return 2.0 * w.vocab / (8.0 * w.hidden + 4.0 * w.mlp);
  return unit == 0 ? 0 : 1;
}

// Each pipeline rank's share (one without a pipeline), as the stage plan assigns the units.
std::vector<RankShare> rank_shares(const Workload& w, const Layout& l) {
  const int units = static_cast<int>(w.unit_parameters.size()), head_unit = units - 1;
  const int v = l.pp == 1 ? 1 : pp::default_virtual_stages(l.schedule);
  const pp::StagePlan plan = l.pp == 1 ? pp::StagePlan{{models::UnitRange{0, units}}, {}}
                                       : pp::balance_stages(w.unit_parameters, l.pp * v);
  std::vector<RankShare> shares(l.pp);
  for (int r = 0; r < l.pp; ++r) {
    RankShare& s = shares[r];
    s.stages = v;
    for (int k = 0; k < v; ++k) {
      const models::UnitRange u = plan.stages[r + k * l.pp];
      for (int i = u.begin; i < u.end; ++i) {
        s.parameters += w.unit_parameters[i];
        if (i == 0) s.embedding = true;
        if (i == head_unit) s.head = true;
        if (i > 0 && i < head_unit) ++s.blocks;
        s.units.push_back(i);
        s.work += forward_work(w, i);
      }
    }
    // The head's copy of the tied embedding is the same.
    if (s.embedding && s.head) s.parameters -= w.vocab * w.hidden;
  }
  return shares;
}

bool spans_nodes(int group_span, const Machine& m) {
  return group_span > m.ranks_per_node;
}

// A transformer's workload, as the model reports it: a GPT's at `seq_len` tokens (0: its block
// size), a ViT's from its images.
Workload transformer_workload(const std::string& name, const models::Workload& reported,
                              int64_t seq_len) {
  Workload w;
  static_cast<models::Workload&>(w) = reported;
  if (w.language()) {
    w.seq_len = seq_len == 0 ? w.tokens : seq_len;
    DTORCH_CHECK_T(ConfigError, w.seq_len >= 1 && w.seq_len <= w.tokens, "--seq-len ", seq_len,
                   " is outside ", name, "'s 1 to ", w.tokens, " tokens");
  } else {
    DTORCH_CHECK_T(ConfigError, seq_len == 0, "--seq-len ", seq_len, " is for a gpt-* model; ",
                   name, " takes its tokens from its images: drop --seq-len");
    w.seq_len = w.tokens;
  }
  w.largest_block_parameter = w.mlp * w.hidden;
  return w;
}

// An image model that is not a transformer (resnet*, mnist-*), measured: two images of
// Fashion-MNIST's shape (batch norm in training needs two values a channel) through each unit
// built alone, the previous unit's output its input. Hooks on its convolutions and linear layers
// (Note [Module hooks]) count their FLOPs and output bytes; the allocation meter counts what
// forward keeps and the most backward holds beyond it.
Workload measured_workload(const std::string& name, int64_t seq_len) {
  DTORCH_CHECK_T(ConfigError, seq_len == 0, "--seq-len ", seq_len, " is for a gpt-* model; ", name,
                 " takes images: drop --seq-len");
  constexpr int64_t kImages = 2;
  const models::ImageInput input;
  Workload w;
  torch::Tensor x = torch::randn({kImages, input.channels, input.size, input.size});
  int64_t largest = 0, largest_in_blocks = 0;
  models::for_each_unit(name, input, [&](int, models::Model& unit) {
    UnitWork u;
    u.block = !unit.block_names().empty();
    int64_t parameters = 0;
    for (const auto& p : unit.parameters()) {
      parameters += p.numel();
      largest = std::max(largest, p.numel());
      if (u.block) largest_in_blocks = std::max(largest_in_blocks, p.numel());
    }
    w.unit_parameters.push_back(parameters);
    w.layers += u.block ? 1 : 0;
    for (const auto& module : unit.modules(/*include_self=*/false)) {
      const auto* conv = module->as<torch::nn::Conv2d>();
      const auto* linear = module->as<torch::nn::Linear>();
      if (!conv && !linear) continue;
      const torch::Tensor weight = conv ? conv->weight : linear->weight;
      double& flops = conv ? u.conv_flops : u.matmul_flops;
      const double per_output = double(weight.numel() / weight.size(0));  // multiply-adds
      models::ModuleHooks hooks;
      hooks.post = [&u, &flops, per_output](torch::Tensor y) {
        flops += 2 * double(y.numel()) * per_output / kImages;
        u.weighted_output_bytes += double(y.numel() * y.element_size()) / kImages;
        return y;
      };
      models::set_module_hooks(*module, std::move(hooks));
    }
    // A unit after the first takes its input's gradient, as in training.
    if (!w.unit_work.empty()) x.requires_grad_(true);
    torch::Tensor y;
    {
      const AllocationMeter meter;  // off before x, allocated without it, is freed
      y = unit.forward(x);
      u.kept_bytes = double(meter.current()) / kImages;
    }
    for (const auto& module : unit.modules(/*include_self=*/false))
      models::clear_module_hooks(*module);
    u.output_bytes = double(y.numel() * y.element_size()) / kImages;
    const torch::Tensor grad = torch::randn_like(y);
    {
      // Its parameters' gradients are the model state's (Note [Cost model]), not the unit's.
      const AllocationMeter meter;
      y.backward(grad);
      u.backward_bytes = std::max(0.0, double(meter.peak() - 4 * parameters)) / kImages;
    }
    x = y.detach();
    w.unit_work.push_back(u);
  });
  w.largest_block_parameter = w.layers > 0 ? largest_in_blocks : largest;
  return w;
}

}  // namespace

Workload workload_of(const std::string& name, int64_t seq_len, int64_t global_batch) {
  DTORCH_CHECK_T(ConfigError, global_batch >= 1, "--global-batch-size must be >= 1 (got ",
                 global_batch, ")");
  // Its first unit built alone reports the whole model's workload.
  const models::Workload reported = models::make_model(name, {0, 1})->workload();
  Workload w = reported.transformer() ? transformer_workload(name, reported, seq_len)
                                      : measured_workload(name, seq_len);
  w.model = name;
  w.global_batch = global_batch;
  return w;
}

std::string flags_of(const Layout& l, const Workload& w, const std::string& offload_dir) {
  std::ostringstream f;
  f << "--model " << w.model;
  if (w.language()) f << " --seq-len " << w.seq_len;
  f << " --batch-size " << w.global_batch / l.dp << " --strategy "
    << zero::stage_names().at(l.zero);
  if (l.tp > 1) f << " --tp " << l.tp;
  if (l.cp > 1) f << " --cp " << l.cp;
  if (l.pp > 1)
    f << " --pp " << l.pp << " --schedule " << name_of(l.schedule) << " --microbatches "
      << l.microbatches;
  if (l.activation_checkpointing) f << " --activation-checkpointing 1";
  if (l.offload) f << " --offload-optimizer nvme";
  if (l.offload_params) f << " --offload-params nvme";
  if (l.offload && !offload_dir.empty()) f << " --offload-dir " << offload_dir;
  if (l.dp_replicate > 1) f << " --dp-replicate " << l.dp_replicate;
  return f.str();
}

double attention_scores(const AttentionShape& s) {
  return s.batch * double(s.heads) * double(s.local_tokens) * double(s.local_tokens * s.cp);
}

RingAttentionTime ring_attention_time(const Machine& m, const AttentionShape& s, bool across_nodes,
                                      bool recomputed) {
  RingAttentionTime r;
  const double scores = attention_scores(s);
  const double rate = m.flops(s.element_bytes == 2 ? "bf16" : "fp32", s.batch * s.local_tokens);
  r.attention_s = 3 * 4 * scores * double(s.head_dim) / rate;  // forward and backward
  const cp::LayerBytes bytes = cp::bytes_sent_per_layer(
      cp::Kind::Ring, s.cp, int64_t(s.batch), s.heads, s.local_tokens, s.head_dim, s.element_bytes);
  const double messages_s =
      m.seconds(Collective::P2P, 2, double(bytes.forward + bytes.backward), across_nodes);
  r.exposed_s = std::max(0.0, messages_s - r.attention_s);
  const RingAttentionCost& own = m.ring_attention;
  r.own_s = (s.cp * own.step_seconds + scores * own.seconds_per_score) *
            (recomputed ? 1 + own.forward_share : 1);
  return r;
}

namespace {

// What one sample costs the rank's share at micro-batches of `mb` samples: its forward's seconds
// and a recomputation's (activation checkpointing), the bytes it keeps for backward, the
// gradients of its weighted layers' outputs it holds while its weight half waits (Note [Split
// backward]), what it holds once, for the micro-batch in backward alone (a GPT's logits, a
// measured model's backward beyond what forward kept), and the activation message between
// stages.
struct SampleCost {
  double forward_s = 0, recompute_s = 0;
  double kept_bytes = 0, awaiting_bytes = 0, once_bytes = 0, message_bytes = 0;
};

// A transformer's, from its shape: its blocks' and head's FLOPs at the matmul rate for as many
// rows as a micro-batch has tokens on the rank, a ViT's patch embedding at the convolution rate.
SampleCost transformer_sample(const Workload& w, const Machine& m, const Layout& l,
                              const RankShare& share, double mb) {
  const double eb = double(w.element_bytes), C = double(w.hidden), V = double(w.vocab),
               M = double(w.mlp);
  const double T = double(w.seq_len), t = T / l.cp;  // tokens of a sequence on the rank
  const std::string dtype = w.element_bytes == 2 ? "bf16" : "fp32";
  const double rate = m.flops(dtype, mb * t);
  SampleCost c;
  const AttentionShape attention{1,    w.heads / l.tp, int64_t(t), w.hidden / w.heads,
                                 l.cp, w.element_bytes};
  const double attention_f = 4 * attention_scores(attention) * double(attention.head_dim);
  const double block_f = (8 * C * C + 4 * C * M) * t / l.tp + attention_f;
  // A GPT's head: every token's logits over the vocabulary it splits; a ViT's: its class token's.
  const double head_f = !share.head ? 0 : w.language() ? 2 * C * V * t / l.tp : 2 * C * w.classes;
  const double patch_s =
      share.embedding && w.patch_flops > 0 ? w.patch_flops / m.convolution_flops(dtype) : 0;
  c.forward_s = (share.blocks * block_f + head_f) / rate + patch_s;
  c.recompute_s = l.activation_checkpointing ? share.blocks * block_f / rate : 0;

  const double per_token_block = ((w.whole_activations + w.split_activations / l.tp) * C +
                                  2.0 * (double(w.heads) / l.tp) * T) *
                                 eb;
  const double kept_per_token = l.activation_checkpointing
                                    ? C * eb * share.blocks + per_token_block  // inputs + one whole
                                    : per_token_block * share.blocks;
  c.kept_bytes = t * kept_per_token;
  // The gradients of its blocks' linears' outputs: in_proj's 3 C and the MLP's first M split,
  // the two C whole.
  c.awaiting_bytes = t * share.blocks * (2 * C + (3 * C + M) / l.tp) * eb;
  // A GPT's logits for every token, a ViT's for its class token.
  c.once_bytes = !share.head ? 0 : 3 * 4 * (w.language() ? t * V / l.tp : double(w.classes));
  c.message_bytes = t * C * eb;
  return c;
}

// A measured model's (UnitWork), summed over the rank's units: convolutions at the convolution
// rate, linear layers at the matmul rate for a micro-batch's rows. A recomputed block keeps its
// output alone. Backward runs through the units last to first, each holding what the units
// before it keep, its own kept bytes (all of them again, for a recomputed block) and what its
// backward makes beyond them; the most of that beyond what forward kept is held once. The
// message is the largest activation the rank's stages receive or send.
SampleCost measured_sample(const Workload& w, const Machine& m, const Layout& l,
                           const RankShare& share, double mb) {
  const std::string dtype = w.element_bytes == 2 ? "bf16" : "fp32";
  const double rate = m.flops(dtype, mb);
  auto holds = [&](int unit) {
    return std::find(share.units.begin(), share.units.end(), unit) != share.units.end();
  };
  const int units = static_cast<int>(w.unit_work.size());
  SampleCost c;
  for (int i : share.units) {
    const UnitWork& u = w.unit_work[i];
    const double s =
        (u.conv_flops > 0 ? u.conv_flops / m.convolution_flops(dtype) : 0) + u.matmul_flops / rate;
    c.forward_s += s;
    c.awaiting_bytes += u.weighted_output_bytes;
    const bool recomputed = u.block && l.activation_checkpointing;
    if (recomputed) c.recompute_s += s;
    c.kept_bytes += recomputed ? u.output_bytes : u.kept_bytes;
    if (i > 0 && !holds(i - 1))
      c.message_bytes = std::max(c.message_bytes, w.unit_work[i - 1].output_bytes);
    if (i + 1 < units && !holds(i + 1)) c.message_bytes = std::max(c.message_bytes, u.output_bytes);
  }
  double before = c.kept_bytes;  // what the units before the one in backward keep
  for (auto i = share.units.rbegin(); i != share.units.rend(); ++i) {
    const UnitWork& u = w.unit_work[*i];
    before -= u.block && l.activation_checkpointing ? u.output_bytes : u.kept_bytes;
    c.once_bytes = std::max(c.once_bytes, before + u.kept_bytes + u.backward_bytes - c.kept_bytes);
  }
  return c;
}

}  // namespace

Prediction predict(const Workload& w, const Machine& m, const Layout& l) {
  Prediction p;
  p.layout = l;
  const double eb = double(w.element_bytes), C = double(w.hidden), V = double(w.vocab);
  const double t = double(w.seq_len) / l.cp;  // tokens of a sequence on the rank
  const double replica_batch = double(w.global_batch) / l.dp;
  const int microbatches = l.pp > 1 ? l.microbatches : 1;
  const double mb = replica_batch / microbatches;  // sequences per micro-batch
  // The slowest rank: the one with the most forward work (the first of equals).
  const std::vector<RankShare> shares = rank_shares(w, l);
  const RankShare& share =
      *std::max_element(shares.begin(), shares.end(),
                        [](const RankShare& a, const RankShare& b) { return a.work < b.work; });
  const double params_rank = double(share.parameters) / l.tp;

  // Compute: forward seconds of one sample on this rank.
  const SampleCost sample =
      w.measured() ? measured_sample(w, m, l, share, mb) : transformer_sample(w, m, l, share, mb);
  const double forward_s = sample.forward_s, recompute_s = sample.recompute_s;
  const double train_s = 3 * forward_s + recompute_s;  // per sample

  // The tied embedding's gradient on the rank, fp32 (a GPT's).
  const double tied_grad_bytes = 4 * V * C / l.tp;
  // Its copies beyond the one .grad holds, two: its lookup's and the head's, made apart and
  // held while autograd adds them into a third, .grad (at GPT-2's sizes each is larger than
  // glibc ever keeps, so each is mapped and faulted in afresh); under a pipeline, a
  // micro-batch's before it is added into .grad and the copy the first and last stages exchange.
  const double gradient_copies = 2 * tied_grad_bytes;
  // Bytes backward allocates afresh: every gradient and those copies. ZeRO-3's gathered units
  // and gradient buckets come from spares of their size (Note [Spare unit memory]): gpt-small at
  // 2 ranks faulted 0.71 GB a step under ZeRO-3, where these are 0.81 GB and its parameters
  // gathered twice 1.0 GB more.
  const double fresh_bytes = 4 * params_rank + gradient_copies;
  const double fresh_s = fresh_bytes * m.first_touch_seconds_per_byte;

  // Activation bytes of one micro-batch passed between stages.
  const double message = mb * sample.message_bytes;
  p.compute_s = replica_batch * train_s + fresh_s;
  // Ranks that meet in every layer (tensor and context parallelism) wait for each other.
  if (l.tp > 1 || l.cp > 1) p.compute_s += replica_batch * train_s * m.lockstep_fraction;
  // Per rank: the micro-batches of activations it holds at once, and of those how many hold their
  // weights' gradients (zero bubble).
  std::vector<double> in_flight(l.pp, 1), awaiting(l.pp, 0);
  if (l.pp > 1) {
    const double per_stage = 1.0 / share.stages;
    const double link =
        m.seconds(Collective::P2P, 2, message, spans_nodes(l.pp * l.dp * l.cp * l.tp, m));
    pp::Costs costs;
    costs.forward = mb * forward_s * per_stage + link;
    costs.backward_input = mb * (forward_s + recompute_s) * per_stage + link;
    costs.backward_weight = (mb * forward_s + fresh_s / microbatches) * per_stage;
    const pp::Simulation sim = pp::simulate(
        pp::make_schedule(l.schedule, l.pp, microbatches, share.stages), microbatches, costs);
    p.bubble_s = std::max(0.0, sim.makespan - p.compute_s);
    // The simulator counts (stage, micro-batch) pairs.
    for (int r = 0; r < l.pp; ++r) {
      in_flight[r] = sim.peak_activations[r] / double(share.stages);
      awaiting[r] = sim.peak_awaiting_weights[r] / double(share.stages);
    }
  }

  // The optimizer step, over the rank's shard under ZeRO; with its state on disk, the reads and
  // writes of AdamW's two moments that the step does not hide.
  // The ranks a shard spreads over: a replica's under hybrid sharding.
  const int n = l.dp * l.cp / l.dp_replicate;
  const double stepped = l.zero > 0 ? params_rank / n : params_rank;
  const double adamw_s = stepped * m.adamw_seconds_per_parameter;
  p.compute_s += adamw_s;
  // The state a step reads and writes (with the parameter shards on disk, the masters too), and
  // what a rank holds of it instead: the host buffers.
  const double state_bytes = (l.offload_params ? 12 : 8) * stepped;
  const zero::OffloadOptions offload;
  const double buffer_bytes =
      l.offload ? offload.buffers * std::min(double(offload.buffer_bytes), 4 * stepped) : 0;
  if (l.offload) {
    DTORCH_CHECK_T(ConfigError, m.offload_disk.measured(), "machine '", m.name,
                   "' has no offload_disk rates, which a layout with the optimizer's state on "
                   "disk needs: calibrate with dtorch plan calibrate --offload-dir DIR");
    const double disk_s = 2 * state_bytes / m.offload_disk.state_bytes_per_s;
    p.offload_s = std::max(0.0, disk_s - adamw_s);
  }

  // Communication: the strategy's over dp x cp, then tensor and context parallelism's.
  const double grad_bytes = 4 * params_rank;
  const bool dp_across = spans_nodes(l.tp * l.cp * l.dp / l.dp_replicate, m);
  double dp_s = 0;
  if (l.zero == 0) {
    dp_s = m.seconds(Collective::AllReduce, n, grad_bytes, dp_across);
  } else if (l.zero <= 2) {  // the gradients' shards, then the updated parameters
    dp_s = m.seconds(Collective::ReduceScatter, n, grad_bytes, dp_across) +
           m.seconds(Collective::AllGather, n, grad_bytes, dp_across);
  } else {
    dp_s = m.seconds(Collective::ReduceScatter, n, grad_bytes, dp_across) +
           2 * m.seconds(Collective::AllGather, n, grad_bytes, dp_across);
  }
  auto hidden = m.overlap.find(zero::stage_names().at(l.zero));
  p.exposed_comm_s = dp_s * (1 - (hidden == m.overlap.end() ? 0.0 : hidden->second));
  // Each shard's gradient averaged across the replicas' nodes, waited for as each unit's
  // reduction finishes (Note [Hybrid sharding]): nothing hides it, and every rank of a node
  // runs its own at once.
  if (l.dp_replicate > 1) {
    const double chunk = grad_bytes / n;
    p.exposed_comm_s += spans_nodes(l.tp * l.cp * l.dp, m)
                            ? m.concurrent_seconds(Collective::AllReduce, l.dp_replicate, chunk)
                            : m.seconds(Collective::AllReduce, l.dp_replicate, chunk, false);
  }
  if (l.tp > 1) {
    // Megatron: two all-reduces of a block's activations in forward, two in backward, and two
    // more for a recomputed forward.
    const double per_block =
        (l.activation_checkpointing ? 6 : 4) *
        m.seconds(Collective::AllReduce, l.tp, mb * t * C * eb, spans_nodes(l.tp, m));
    p.exposed_comm_s += microbatches * share.blocks * per_block;
  }
  if (l.cp > 1) {
    // The ring's messages hide behind the attention they overlap, what is left is exposed; its
    // own work beyond both is compute.
    const AttentionShape micro_batch{mb,   w.heads / l.tp, int64_t(t), w.hidden / w.heads,
                                     l.cp, w.element_bytes};
    const RingAttentionTime ring = ring_attention_time(m, micro_batch, spans_nodes(l.tp * l.cp, m),
                                                       l.activation_checkpointing);
    p.exposed_comm_s += microbatches * share.blocks * ring.exposed_s;
    p.compute_s += microbatches * share.blocks * ring.own_s;
  }

  // Memory.
  // ZeRO-3 holds its root unit (the parameters outside the blocks: a GPT's embeddings and tied
  // head, split like the vocabulary; a ViT's patch embedding, norm and head, whole) whole through
  // forward and backward, with its whole gradient bucket, and five blocks' memory: two gathered
  // (the running and the prefetched, kept spare once released: Note [Spare unit memory]), the
  // gradient buckets of the two blocks in flight (Note [Buckets in flight]) and one kept spare.
  // A transformer's blocks are all one size, a measured model's are not: the two gathered and the
  // two in flight are the largest two adjacent blocks, the spare the largest block.
  const std::vector<int64_t>& units = w.unit_parameters;
  double largest = 0, pair = 0;
  for (size_t i = 1; i + 1 < units.size(); ++i) {
    largest = std::max(largest, double(units[i]));
    pair = std::max(pair, double(units[i]) + (i + 2 < units.size() ? double(units[i + 1]) : 0));
  }
  const double five_blocks = (2 * pair + largest) / l.tp;
  const double root_params =
      double(units.size() == 1 ? units[0] : units.front() + units.back() - w.vocab * w.hidden) /
      (w.language() ? l.tp : 1);
  // The peak of a rank holding `held`'s units and `flight` and `waiting` micro-batches.
  auto peak_of = [&](const RankShare& held, double flight, double waiting) {
    const double parameters = double(held.parameters) / l.tp;
    const SampleCost c = held.units == share.units ? sample
                         : w.measured()            ? measured_sample(w, m, l, held, mb)
                                                   : transformer_sample(w, m, l, held, mb);
    Prediction q;
    q.model_state_bytes =
        report::model_state_bytes(l.zero, parameters, n,
                                  l.zero == 3 ? 4 * five_blocks + 2 * 4 * root_params : 0,
                                  l.offload ? 0 : 8) +
        buffer_bytes - (l.offload_params ? 4 * parameters / n : 0);
    q.activation_bytes =
        flight * mb * c.kept_bytes + waiting * mb * c.awaiting_bytes + mb * c.once_bytes;
    // What a step holds beyond the model state and the activations (Note [Cost model]).
    q.transient_bytes = gradient_copies;
    if (l.zero == 0) q.transient_bytes += 4 * parameters;  // gradients made afresh
    // The tied embedding's .grad, the sum of its copies, which ZeRO's state does not count:
    // ZeRO-1 adds it into its flat buffer, ZeRO-2 reduces it from where it lies (Note [Gradient
    // buckets of stage 2]), ZeRO-3 copies it into its root unit's bucket.
    if (l.zero > 0) q.transient_bytes += tied_grad_bytes;
    if (l.zero == 2) {
      // Two buckets in flight (Note [Buckets in flight]), each at most the cap unless one
      // parameter of a block (a transformer's MLP weight, M x C) is larger and has a unit of its
      // own.
      const double cap = zero::Options{}.bucket_cap_mb * (1 << 20);
      q.transient_bytes += 2 * std::max(cap, 4 * double(w.largest_block_parameter) / l.tp);
    }
    q.peak_bytes =
        m.base_bytes_per_rank + q.model_state_bytes + q.activation_bytes + q.transient_bytes;
    return q;
  };
  // The slowest rank's share with the most micro-batches any rank holds (a transformer's stages
  // hold the same blocks, give or take the embedding and head), and every rank's own share with
  // its own (a measured model's differ several times over: resnet18's at pp 2 hold 2.8 M and
  // 8.4 M parameters); the largest peak.
  Prediction peak = peak_of(share, *std::max_element(in_flight.begin(), in_flight.end()),
                            *std::max_element(awaiting.begin(), awaiting.end()));
  for (int r = 0; r < l.pp; ++r) {
    const Prediction q = peak_of(shares[r], in_flight[r], awaiting[r]);
    if (q.peak_bytes > peak.peak_bytes) peak = q;
  }
  p.model_state_bytes = peak.model_state_bytes;
  p.activation_bytes = peak.activation_bytes;
  p.transient_bytes = peak.transient_bytes;
  p.peak_bytes = peak.peak_bytes;
  p.fits = p.peak_bytes <= m.memory_per_rank_bytes;
  return p;
}

std::vector<Layout> enumerate_layouts(const Workload& w, int world) {
  DTORCH_CHECK_T(ConfigError, world >= 1, "a plan needs 1 or more ranks (got ", world, ")");
  std::vector<Layout> out;
  const int blocks = static_cast<int>(w.layers);
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    // A measured model has no tensor-parallel plan (a transformer block's linears).
    if (tp > 1 && (w.measured() || w.heads % tp != 0 || w.mlp % tp != 0)) continue;
    for (int pp = 1; pp * tp <= world; ++pp) {
      if ((world / tp) % pp != 0 || (pp > 1 && pp > blocks)) continue;
      for (int cp = 1; cp * pp * tp <= world; ++cp) {
        if ((world / tp / pp) % cp != 0) continue;
        // Context parallelism as the ring's terms know it: a GPT's causal ring (calibrate's).
        if (cp > 1 && (!w.language() || pp > 1 || w.seq_len % (2 * cp) != 0)) continue;
        const int dp = world / (tp * pp * cp);
        if (w.global_batch % dp != 0) continue;
        const int64_t replica_batch = w.global_batch / dp;
        for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero) {
          for (bool ac : {false, true}) {
            if (ac && blocks == 0) continue;  // nothing to recompute (mnist-*)
            Layout l{dp, tp, pp, cp, zero, ac};
            if (pp == 1) {
              out.push_back(l);
              continue;
            }
            for (pp::ScheduleKind s : {pp::ScheduleKind::OneFOneB, pp::ScheduleKind::ZeroBubble,
                                       pp::ScheduleKind::GPipe, pp::ScheduleKind::Interleaved}) {
              const int v = pp::default_virtual_stages(s);
              if (pp * v > blocks + 2) continue;  // a stage per unit at least
              for (int k : {1, 2, 4}) {
                const int m = k * pp;
                if (replica_batch % m != 0) continue;
                l.schedule = s;
                l.microbatches = m;
                out.push_back(l);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<Prediction> rank_layouts(const Workload& w, const Machine& m, int world,
                                     OffloadLayouts offload) {
  const bool can_offload = m.offload_disk.measured() && m.device == "cpu";
  DTORCH_CHECK_T(
      ConfigError, offload != OffloadLayouts::Only || m.device == "cpu",
      "--offload-optimizer nvme: machine '", m.name,
      "' computes on a GPU, and the plan has no rates for a GPU's offload (its copies to the "
      "host): plan without it, and compare a run with the flag by hand");
  DTORCH_CHECK_T(ConfigError, offload != OffloadLayouts::Only || can_offload,
                 "--offload-optimizer nvme: machine '", m.name,
                 "' has no offload_disk rates: calibrate with dtorch plan calibrate --offload-dir "
                 "DIR (a folder on the disk the runs would use)");
  std::vector<Prediction> out;
  // `l` as it is and, where asked, with its optimizer's state on disk.
  auto add = [&](const Layout& l) {
    Prediction p = predict(w, m, l);
    if (offload != OffloadLayouts::None && can_offload && l.zero > 0 &&
        (offload == OffloadLayouts::Only || !p.fits)) {
      Layout twin = l;
      twin.offload = true;
      out.push_back(predict(w, m, twin));
      // ZeRO-3's parameter shards too, where the state alone on disk is not enough.
      if (l.zero == 3 && (offload == OffloadLayouts::Only || !out.back().fits)) {
        twin.offload_params = true;
        out.push_back(predict(w, m, twin));
      }
    }
    if (offload != OffloadLayouts::Only) out.push_back(std::move(p));
  };
  for (const Layout& l : enumerate_layouts(w, world)) {
    add(l);
    // Note [Hybrid sharding]: a ZeRO layout over several nodes also with a replica a node (as
    // --dp-replicate auto lays it out).
    const int replicas = parallel::replicas_a_node(world, l.pp, m.ranks_per_node);
    if (l.zero > 0 && replicas > 1 && l.dp % replicas == 0) {
      Layout hybrid = l;
      hybrid.dp_replicate = replicas;
      add(hybrid);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s() < b.step_s();
  });
  return out;
}

}  // namespace dtorch::plan
