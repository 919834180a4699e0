// Note [Cost model]: the terms, the layouts they are summed for, and the ranking.
#include "dtorch/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dtorch/core/error.h"
#include "dtorch/models/gpt.h"
#include "dtorch/models/registry.h"
#include "dtorch/models/vit.h"
#include "dtorch/parallel/cp/context_parallel.h"
#include "dtorch/parallel/pp/stage_plan.h"
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
  int stages = 1;  // stages per rank (interleaved: 2)
};

// The slowest rank's share: the one with the most block and head work.
RankShare slowest_share(const Workload& w, const Layout& l) {
  if (l.pp == 1) {
    RankShare s;
    for (int64_t p : w.unit_parameters)
      s.parameters += p;
    s.blocks = static_cast<int>(w.layers);
    s.embedding = s.head = true;
    s.parameters -= w.vocab * w.hidden;  // the head's copy of the tied embedding is the same
    return s;
  }
  const int v = pp::default_virtual_stages(l.schedule);
  const pp::StagePlan plan = pp::balance_stages(w.unit_parameters, l.pp * v);
  const int head_unit = static_cast<int>(w.unit_parameters.size()) - 1;
  RankShare worst;
  double worst_work = -1;
  for (int r = 0; r < l.pp; ++r) {
    RankShare s;
    s.stages = v;
    for (int k = 0; k < v; ++k) {
      const models::UnitRange u = plan.stages[r + k * l.pp];
      for (int i = u.begin; i < u.end; ++i) {
        s.parameters += w.unit_parameters[i];
        if (i == 0) s.embedding = true;
        if (i == head_unit) s.head = true;
        if (i > 0 && i < head_unit) ++s.blocks;
      }
    }
    // Work in units of a block: a GPT's head's matmul is 2 V / (8 C + 4 M) blocks' worth (V /
    // 12 C at M = 4 C), a ViT's (its class token's) none to speak of.
    if (s.embedding && s.head) s.parameters -= w.vocab * w.hidden;
    const double head_blocks = 2.0 * w.vocab / (8.0 * w.hidden + 4.0 * w.mlp);
    const double work = s.blocks + (s.head ? head_blocks : 0);
    if (work > worst_work) worst_work = work, worst = s;
  }
  return worst;
}

bool spans_nodes(int group_span, const Machine& m) {
  return group_span > m.ranks_per_node;
}

// A ViT's workload: its images give its tokens (patches and the class token).
Workload vit_workload(const std::string& name, int64_t seq_len) {
  DTORCH_CHECK_T(ConfigError, seq_len == 0, "--seq-len ", seq_len, " is for a gpt-* model; ", name,
                 " takes its tokens from its images: drop --seq-len");
  auto one_block = models::make_model(name, {1, 2});
  const auto* vit = dynamic_cast<const models::VisionTransformer*>(one_block.get());
  DTORCH_CHECK(vit, name, " is not a ViT");
  const models::ViTConfig& c = vit->config();
  const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
  Workload w;
  w.layers = c.num_layers;
  w.hidden = c.hidden_dim;
  w.heads = c.num_heads;
  w.mlp = c.mlp_dim;
  w.classes = c.num_classes;
  w.seq_len = patches + 1;
  w.patch_flops =
      2.0 * double(patches * c.hidden_dim * c.in_channels * c.patch_size * c.patch_size);
  // A block keeps its input, ln_1's and ln_2's outputs and the residual sum whole (4 C), and
  // in_proj's q | k | v, the attention's output, fc1's and GELU's outputs split (3 C + C + 2 M,
  // 12 C at M = 4 C): vit-tiny kept 239 MB in forward at 32 images a rank where these are 236 MB
  // (50 tokens, 12 blocks), and the attention matrices 23 MB more, which LibTorch 2.x's fused
  // attention does not keep.
  w.whole_activations = 4;
  w.split_activations = 4 + 2.0 * double(c.mlp_dim) / double(c.hidden_dim);
  for (const models::UnitSize& u : models::model_units(name))
    w.unit_parameters.push_back(u.parameters);
  return w;
}

// A GPT's workload at `seq_len` tokens (0: its block size).
Workload gpt_workload(const std::string& name, int64_t seq_len) {
  // One block built alone (cheap even for gpt-large) gives the shape and a block's size.
  auto one_block = models::make_model(name, {1, 2});
  const auto* gpt = dynamic_cast<const models::GPT*>(one_block.get());
  DTORCH_CHECK(gpt, name, " is not a GPT");
  const models::GPTConfig& c = gpt->config();
  Workload w;
  w.layers = c.n_layer;
  w.hidden = c.n_embd;
  w.heads = c.n_head;
  w.mlp = 4 * c.n_embd;
  w.vocab = c.vocab_size;
  w.seq_len = seq_len == 0 ? c.block_size : seq_len;
  DTORCH_CHECK_T(ConfigError, w.seq_len >= 1 && w.seq_len <= c.block_size, "--seq-len ", seq_len,
                 " is outside ", name, "'s 1 to ", c.block_size, " tokens");
  // A GPT block's tensors: 4 C whole and 16 C split per token (gpt-small and gpt-large at 2 and 4
  // ranks, BENCHMARKS.md's plan table).
  w.whole_activations = 4;
  w.split_activations = 16;
  int64_t block = 0;
  for (const auto& p : one_block->parameters())
    block += p.numel();
  // Units as models::model_units counts them: the embeddings, the blocks, the head (its final
  // norm and its copy of the tied embedding).
  w.unit_parameters.push_back((c.vocab_size + c.block_size) * c.n_embd);
  for (int64_t i = 0; i < c.n_layer; ++i)
    w.unit_parameters.push_back(block);
  w.unit_parameters.push_back(2 * c.n_embd + c.vocab_size * c.n_embd);
  return w;
}

}  // namespace

Workload workload_of(const std::string& name, int64_t seq_len, int64_t global_batch) {
  const bool gpt = name.rfind("gpt-", 0) == 0, vit = name.rfind("vit-", 0) == 0;
  DTORCH_CHECK_T(ConfigError, gpt || vit, "dtorch plan has cost terms for the transformers ",
                 "(gpt-*, vit-*), not for ", name, ": plan a gpt-* or vit-* model");
  DTORCH_CHECK_T(ConfigError, global_batch >= 1, "--global-batch-size must be >= 1 (got ",
                 global_batch, ")");
  Workload w = vit ? vit_workload(name, seq_len) : gpt_workload(name, seq_len);
  w.model = name;
  w.global_batch = global_batch;
  return w;
}

std::string flags_of(const Layout& l, const Workload& w) {
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

Prediction predict(const Workload& w, const Machine& m, const Layout& l) {
  Prediction p;
  p.layout = l;
  const double eb = double(w.element_bytes), C = double(w.hidden), V = double(w.vocab),
               M = double(w.mlp);
  const double T = double(w.seq_len), t = T / l.cp;  // tokens of a sequence on the rank
  const double replica_batch = double(w.global_batch) / l.dp;
  const int microbatches = l.pp > 1 ? l.microbatches : 1;
  const double mb = replica_batch / microbatches;  // sequences per micro-batch
  // The matmuls' rows are the micro-batch's tokens on the rank.
  const std::string dtype = w.element_bytes == 2 ? "bf16" : "fp32";
  const double rate = m.flops(dtype, mb * t);
  const RankShare share = slowest_share(w, l);
  const double params_rank = double(share.parameters) / l.tp;

  // Compute: forward seconds of one sample on this rank, its blocks' and head's FLOPs at the
  // matmul rate and a ViT's patch embedding at the convolution rate.
  const AttentionShape attention{1,    w.heads / l.tp, int64_t(t), w.hidden / w.heads,
                                 l.cp, w.element_bytes};
  const double attention_f = 4 * attention_scores(attention) * double(attention.head_dim);
  const double block_f = (8 * C * C + 4 * C * M) * t / l.tp + attention_f;
  // A GPT's head: every token's logits over the vocabulary it splits; a ViT's: its class token's.
  const double head_f = !share.head ? 0 : w.language() ? 2 * C * V * t / l.tp : 2 * C * w.classes;
  const double patch_s =
      share.embedding && w.patch_flops > 0 ? w.patch_flops / m.convolution_flops(dtype) : 0;
  const double forward_s = (share.blocks * block_f + head_f) / rate + patch_s;
  const double recompute_s = l.activation_checkpointing ? share.blocks * block_f / rate : 0;
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
  const double message = mb * t * C * eb;
  p.compute_s = replica_batch * train_s + fresh_s;
  // Ranks that meet in every layer (tensor and context parallelism) wait for each other.
  if (l.tp > 1 || l.cp > 1) p.compute_s += replica_batch * train_s * m.lockstep_fraction;
  double in_flight = 1;  // micro-batches of activations the rank holds at once
  double awaiting = 0;   // of those, how many hold their weights' gradients (zero bubble)
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
    in_flight = *std::max_element(sim.peak_activations.begin(), sim.peak_activations.end()) /
                double(share.stages);
    awaiting =
        *std::max_element(sim.peak_awaiting_weights.begin(), sim.peak_awaiting_weights.end()) /
        double(share.stages);
  }

  // The optimizer step, over the rank's shard under ZeRO.
  const int n = l.dp * l.cp;
  p.compute_s += (l.zero > 0 ? params_rank / n : params_rank) * m.adamw_seconds_per_parameter;

  // Communication: the strategy's over dp x cp, then tensor and context parallelism's.
  const double grad_bytes = 4 * params_rank;
  const bool dp_across = spans_nodes(l.tp * l.cp * l.dp, m);
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
    AttentionShape micro_batch = attention;
    micro_batch.batch = mb;
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
  const double block_params = double(w.unit_parameters.at(1)) / l.tp;
  const double root_params =
      double(w.unit_parameters.front() + w.unit_parameters.back() - w.vocab * w.hidden) /
      (w.language() ? l.tp : 1);
  p.model_state_bytes = report::model_state_bytes(
      l.zero, params_rank, n, l.zero == 3 ? 5 * 4 * block_params + 2 * 4 * root_params : 0);
  const double per_token_block = ((w.whole_activations + w.split_activations / l.tp) * C +
                                  2.0 * (double(w.heads) / l.tp) * T) *
                                 eb;
  const double kept_per_token = l.activation_checkpointing
                                    ? C * eb * share.blocks + per_token_block  // inputs + one whole
                                    : per_token_block * share.blocks;
  // Per sample: a GPT's logits for every token, a ViT's for its class token.
  const double logits = !share.head ? 0 : 3 * 4 * (w.language() ? t * V / l.tp : double(w.classes));
  // A micro-batch whose weight gradients wait (Note [Split backward]) holds the gradients of its
  // blocks' linears' outputs: in_proj's 3 C and the MLP's first M split, the two C whole.
  const double weight_grads_per_token = (2 * C + (3 * C + M) / l.tp) * eb;
  p.activation_bytes = in_flight * mb * t * kept_per_token +
                       awaiting * mb * t * share.blocks * weight_grads_per_token + mb * logits;
  // What a step holds beyond the model state and the activations (Note [Cost model]).
  p.transient_bytes = gradient_copies;
  if (l.zero == 0) p.transient_bytes += 4 * params_rank;  // gradients made afresh
  // The tied embedding's .grad, the sum of its copies, which ZeRO's state does not count: ZeRO-1
  // adds it into its flat buffer, ZeRO-2 reduces it from where it lies (Note [Gradient buckets
  // of stage 2]), ZeRO-3 copies it into its root unit's bucket.
  if (l.zero > 0) p.transient_bytes += tied_grad_bytes;
  if (l.zero == 2) {
    // Two buckets in flight (Note [Buckets in flight]), each at most the cap unless one
    // parameter, the MLP's (M x C), is larger and has a unit of its own.
    const double cap = zero::Options{}.bucket_cap_mb * (1 << 20);
    p.transient_bytes += 2 * std::max(cap, 4 * M * C / l.tp);
  }
  p.peak_bytes =
      m.base_bytes_per_rank + p.model_state_bytes + p.activation_bytes + p.transient_bytes;
  p.fits = p.peak_bytes <= m.memory_per_rank_bytes;
  return p;
}

std::vector<Layout> enumerate_layouts(const Workload& w, int world) {
  DTORCH_CHECK_T(ConfigError, world >= 1, "a plan needs 1 or more ranks (got ", world, ")");
  std::vector<Layout> out;
  const int blocks = static_cast<int>(w.layers);
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0 || w.heads % tp != 0 || w.mlp % tp != 0) continue;
    for (int pp = 1; pp * tp <= world; ++pp) {
      if ((world / tp) % pp != 0 || pp > blocks) continue;
      for (int cp = 1; cp * pp * tp <= world; ++cp) {
        if ((world / tp / pp) % cp != 0) continue;
        // Context parallelism as the ring's terms know it: a GPT's causal ring (calibrate's).
        if (cp > 1 && (!w.language() || pp > 1 || w.seq_len % (2 * cp) != 0)) continue;
        const int dp = world / (tp * pp * cp);
        if (w.global_batch % dp != 0) continue;
        const int64_t replica_batch = w.global_batch / dp;
        for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero) {
          for (bool ac : {false, true}) {
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

std::vector<Prediction> rank_layouts(const Workload& w, const Machine& m, int world) {
  std::vector<Prediction> out;
  for (const Layout& l : enumerate_layouts(w, world))
    out.push_back(predict(w, m, l));
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s() < b.step_s();
  });
  return out;
}

}  // namespace dtorch::plan
