// What a layout costs before it runs: a few documented terms (Note [Cost model]) that predict
// one optimizer step's time, split into compute, exposed communication and pipeline bubble,
// and each rank's peak memory, from the model's shape and a machine's measured rates
// (plan/machine.h). Pure: tested without processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtorch/models/workload.h"
#include "dtorch/parallel/pp/schedule.h"
#include "dtorch/plan/machine.h"

namespace dtorch::plan {

// Note [Cost model]
// A step of global batch B over dp x cp x tp x pp ranks costs, on the slowest rank:
// - compute: the floating-point operations of its units (pipeline stage) on its share of the
//   batch (B / dp samples, T / cp tokens each, 1 / tp of every block's matrices) at the
//   machine's measured matmul rate for as many rows as a micro-batch has tokens on the rank
//   (a few rows run well below the peak: calibrate measures a linear layer's three products
//   at 16 to 4096 rows). A transformer block's forward takes 8 C^2 + 4 C M + 4 T C per token
//   (attention's four C x C matmuls, the MLP's two C x M, attention's two T x T x C products;
//   24 C^2 + 4 T C at GPT-2's and ViT-Ti's M = 4 C), a GPT's head 2 C V per token, a ViT's
//   head 2 C K for its class token alone, and a ViT's patch embedding its convolution's FLOPs
//   at the machine's convolution rate (calibrate times a 3x3 convolution layer's three
//   products); backward twice the forward, and a recomputed block (activation checkpointing)
//   its forward once more. The other image models (resnet*, mnist-*) are measured, not written
//   down (UnitWork): two images run through each unit built alone, hooks on its convolutions
//   and linear layers (Note [Module hooks]) count each one's FLOPs from its output, at the
//   convolution rate and at the matmul rate for as many rows as a micro-batch has images. Backward
//   also pays the first touch of the bytes it allocates afresh (every gradient, the tied
//   embedding's two copies; ZeRO-3's gathered units reuse memory) at the machine's measured seconds
//   per byte: page faults on a CPU, where the allocator hands large buffers back to the kernel; 0
//   on a GPU. The optimizer step adds the rank's parameters (1/n of them under ZeRO over n ranks)
//   at the measured AdamW time per parameter. Under context parallelism each layer's ring attention
//   adds its own work beyond its FLOPs and messages (ring_attention_time): calibrate times a
//   layer's ring over 2 ranks at two sizes and keeps the rest as a time per ring step (cp of them a
//   layer) and a time per score; a recomputed layer pays its forward's share of it again. Ranks
//   that meet in every layer (tensor and context parallelism) pay the machine's lockstep fraction
//   of their FLOPs' time more: calibrate times pairs of ranks running a linear layer's products 40
//   times with and without a one-float all-reduce after each, every rank of the job in the same
//   mode at once, and keeps the median of seven timings each way (at 4 ranks on 2 cores one timing
//   each way read from -0.14 to +0.43).
// - the pipeline bubble: the schedule simulated on paper (parallel/pp/schedule.h) with each
//   micro-batch's forward and backward times of the slowest stage, plus the activation
//   message's time (a transformer's C per token; a measured model's largest output where the
//   rank's stages begin or end); the bubble is the makespan less the rank's compute.
// - communication, each collective costed as the machine measured it for its group size and
//   link (latency per step plus bus bytes over bus bandwidth: a ring all-reduce moves 2 (n-1)/n
//   of the buffer, a reduce-scatter or all-gather (n-1)/n): the strategy's over dp x cp (ddp:
//   an all-reduce of the gradients; zero1 and zero2: a reduce-scatter of the gradients and the
//   updated parameters' all-gather; zero3: two all-gathers and a reduce-scatter; with
//   --dp-replicate R, those over a replica's dp x cp / R ranks and an all-reduce of each shard's
//   gradient across the R replicas' nodes, Note [Hybrid sharding]), tensor
//   parallelism's four all-reduces of a block's activations per micro-batch (Megatron),
//   context parallelism's ring bytes (cp::bytes_sent_per_layer). A group spans nodes when its ranks
//   do (the mesh puts tp fastest, then cp, dp, pp: Note [Mesh layout]). What a strategy hides
//   behind backward is the machine's overlap fraction for it; the rest is exposed.
// - memory per rank: the model state as the ZeRO paper counts it (report::model_state_bytes;
//   ZeRO-3 adds its root unit, the embeddings and tied head, whole with its whole gradients
//   through forward and backward, and five blocks: two gathered, two blocks' gradient buckets
//   in flight and one kept spare, where blocks differ in size the largest two adjacent twice and
//   the largest once; the tied embedding counts once on a rank that holds both ends), the
//   activations each block keeps per token (its tensors: a GPT's 4 C whole and 16 C split by
//   tensor parallelism, a ViT's 4 C and 3 C + C + 2 M, and the attention matrices' 2 H T / cp
//   floats; C with activation checkpointing, plus one block's whole while it recomputes) times
//   the micro-batches in flight (the simulator's peak). A measured model keeps what the
//   allocation meter counted per unit (what its forward allocated and still held at its end; a
//   recomputed block its output alone), and its micro-batch in backward, once, the most that
//   backward holds beyond: the units before the one in backward keep theirs, that one all it
//   kept (again, when recomputed) and what its backward allocates beyond its parameters'
//   gradients (its activations' gradients, a layer's scratch, measured with the meter too). On
//   top come the gradients of the blocks' linears' outputs (2 C whole and 3 C + M split per
//   token; a measured model's: its convolutions' and linear layers' outputs) that a zero-bubble
//   schedule records for each micro-batch whose weight half waits (Note [Split backward]; the
//   simulator's peak of them: vit-tiny's peaks under ZB were 13% and 17% over the prediction
//   without them, 7% with), the logits' three copies (a GPT's, for every token), the machine's
//   base bytes per process, and what a step holds beyond them at its peak, the end of backward,
//   where the tied embedding's gradient is made: two copies of it (its lookup's and the head's,
//   held while autograd adds them into .grad; under a pipeline a micro-batch's before it is
//   added into .grad, and the copy the first and last stages exchange); under ddp every
//   gradient as backward makes it afresh; under ZeRO that .grad too, which its state does not
//   count (ZeRO-1 adds it into its flat buffer, ZeRO-2 reduces it where it lies, ZeRO-3 copies
//   it into its root's bucket); under ZeRO-2 the two gradient buckets in flight (Note [Buckets
//   in flight]), at most the bucket cap each unless a block's largest parameter alone is
//   larger. At their peak RSS, gpt-small at 2 ranks held the three copies under ddp and ZeRO-1
//   to -3 and gpt-large under ZeRO-3 (the allocation meter), and ZeRO-3 its root's two mappings
//   and five blocks' (its mapped bytes). Under a pipeline the peak is the largest of every
//   rank's, each with its own stages and micro-batches in flight, and of the slowest rank's with
//   the most micro-batches any rank holds: a transformer's stages hold the same blocks give or
//   take the embedding and head, a measured model's differ several times over (resnet18's two
//   stages hold 2.8 M and 8.4 M parameters, the first the most FLOPs).
// - the optimizer's state on disk (--offload-optimizer nvme, Note [Optimizer state on disk]):
//   the rank's memory holds no moments (8 bytes a parameter of its shard under AdamW) but the
//   offload's host buffers (4 of at most 32 MiB), and each step reads the shard's state from the
//   offload folder's disk and writes it back while AdamW steps the pieces read before. The step
//   takes the longer of the two: its state's bytes, read and written, at the rate calibrate
//   measured an offloaded AdamW step move them with every rank of a node stepping at once
//   (Machine::offload_disk), or AdamW's own time; what it takes beyond AdamW's is the step's
//   offload term. With ZeRO-3's parameter shards there too (--offload-params nvme, Note
//   [Parameters on disk]) the rank holds no master shard either (4 bytes a parameter of it),
//   and the step reads and writes those 4 bytes beside the moments' 8 at the same rate; the
//   gathers that read a shard again find it in the page cache the step wrote it to.
// Every term is printed, so a miss can be traced to the term that made it.

/// One pipeline unit of an image model that is not a transformer (resnet*, mnist-*), as the
/// planner measured it running two images through it alone, per image (Note [Cost model]).
struct UnitWork {
  /// Its forward's floating-point operations in convolutions, at the convolution rate, and in
  /// linear layers, at the matmul rate: 2 a multiply-add, each layer's from its output's
  /// elements and its weight's per output channel.
  double conv_flops = 0, matmul_flops = 0;
  /// Bytes its forward keeps for backward, its output among them (the allocation meter's count
  /// of what forward allocated and had not freed at its end).
  double kept_bytes = 0;
  /// The most bytes its backward holds beyond what forward kept and its parameters' gradients
  /// (the gradients of its activations, a layer's scratch), measured at the allocator.
  double backward_bytes = 0;
  /// Bytes of its output: the pipeline's message after it, and what it keeps when it is a block
  /// that is recomputed.
  double output_bytes = 0;
  /// Bytes of its convolutions' and linear layers' outputs, whose gradients a micro-batch holds
  /// while its weight half waits (Note [Split backward]).
  double weighted_output_bytes = 0;
  /// One of the model's repeating blocks (a ResNet's stage), which activation checkpointing
  /// recomputes.
  bool block = false;
};

/// The model as the cost model sees it: a transformer as it reports itself (models::Workload: a
/// GPT's, gpt-*, or a ViT's, vit-*), or another image model's units as measured (resnet*,
/// mnist-*: its blocks in `layers`, its units' sizes), and what the job runs it at.
struct Workload : models::Workload {
  std::string model;
  /// Tokens per sample: a GPT's sequence (at most its `tokens`), a ViT's patches and class token.
  int64_t seq_len = 0;
  int64_t global_batch = 0;
  /// The elements of a block's largest parameter (a transformer's MLP weight, M x C; the
  /// model's largest where it has no blocks): a ZeRO-2 gradient bucket holds at least it.
  int64_t largest_block_parameter = 0;
  /// A measured model's units (resnet*, mnist-*), one per unit; empty for a transformer, whose
  /// terms come from its shape.
  std::vector<UnitWork> unit_work;
  /// 4 (fp32) or 2 (bf16/fp16 compute).
  int64_t element_bytes = 4;
  /// Whether its units were measured (an image model other than a ViT): no tensor or context
  /// parallelism, whose terms are a transformer block's.
  bool measured() const { return !unit_work.empty(); }
};

/// The workload of model `name` at `seq_len` tokens (a GPT's; 0: the model's block size; an image
/// model's must be 0: its images give its tokens) and `global_batch` samples. An image model that
/// is not a ViT is measured on Fashion-MNIST's 1 x 28 x 28 images, what dtorch train feeds it.
/// ConfigError for a model the registry does not know.
Workload workload_of(const std::string& name, int64_t seq_len, int64_t global_batch);

/// One layout: the degrees, the strategy, recomputation and the pipeline's schedule.
struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int zero = 0;  ///< 0: ddp, 1-3: ZeRO's stage
  bool activation_checkpointing = false;
  int microbatches = 1;  ///< per step, under a pipeline
  pp::ScheduleKind schedule = pp::ScheduleKind::OneFOneB;
  /// ZeRO's optimizer state on disk between steps (--offload-optimizer nvme)
  bool offload = false;
  /// With `offload` under ZeRO-3, the parameter shards there too (--offload-params nvme)
  bool offload_params = false;
  /// ZeRO's replicas (--dp-replicate): the shards spread over dp x cp / dp_replicate ranks
  /// (Note [Hybrid sharding] in parallel/zero/sharded_model_reduce.cpp)
  int dp_replicate = 1;
};

/// The `dtorch train` flags that run `layout` on `world` ranks (--nproc-per-node or a
/// launcher gives the ranks); an offload layout's with `--offload-dir offload_dir` where that is
/// given (the folder its disk rates were measured in).
std::string flags_of(const Layout& layout, const Workload& w, const std::string& offload_dir = "");

struct Prediction {
  Layout layout;
  double compute_s = 0, exposed_comm_s = 0, bubble_s = 0;
  /// What the step waits for the disk beyond the optimizer step that overlaps it (an offload
  /// layout's; Note [Cost model]).
  double offload_s = 0;
  double step_s() const { return compute_s + exposed_comm_s + bubble_s + offload_s; }
  /// Peak bytes per rank, and its parts (transient: what a step holds beyond the model state
  /// and the activations, Note [Cost model]).
  double peak_bytes = 0, model_state_bytes = 0, activation_bytes = 0, transient_bytes = 0;
  /// Whether it fits the machine's memory per rank.
  bool fits = true;
};

/// One layer's attention on a rank: `batch` sequences of `local_tokens`, the rank's share of
/// a sequence split over `cp` ranks (1: the whole), `heads` (after tensor parallelism's split)
/// of `head_dim`, activations of `element_bytes`.
struct AttentionShape {
  double batch = 1;
  int64_t heads = 1, local_tokens = 1, head_dim = 1;
  int cp = 1;
  int64_t element_bytes = 4;
};

/// The scores that layer's forward computes: each of the rank's queries against every key of
/// its sequence, per head (a ring's every step included). Its two products (queries by keys,
/// scores by values) take 4 head_dim FLOPs a score.
double attention_scores(const AttentionShape& s);

/// What the cost model charges that layer under context parallelism (a ring), forward and
/// backward: its FLOPs at the matmul rate for its rows (`attention_s`, as every attention), the
/// ring's messages those do not hide (`exposed_s`), and the ring's own work beyond both (`own_s`,
/// from the machine's ring_attention; with `recomputed`, its forward once more). Calibration
/// measures the ring's own work as what a layer takes beyond the first two.
struct RingAttentionTime {
  double attention_s = 0, exposed_s = 0, own_s = 0;
};
RingAttentionTime ring_attention_time(const Machine& m, const AttentionShape& s, bool across_nodes,
                                      bool recomputed);

/// The prediction for `layout` (Note [Cost model]).
Prediction predict(const Workload& w, const Machine& m, const Layout& layout);

/// Every layout of `world` ranks (nodes x ranks_per_node) that the run configuration accepts
/// for `w`: dp x tp x pp x cp = world with tp (a transformer's) dividing the heads and the MLP's
/// width, cp (a GPT's: the ring's terms are a causal ring's) the tokens' 2 cp chunks (without a
/// pipeline), pp at most the blocks, dp dividing the batch; each strategy, with and without
/// recomputation where there are blocks (ZeRO only where dp x cp > 1: on one rank it is ddp);
/// under a pipeline 1F1B, ZB-H1, GPipe
/// and interleaved 1F1B with pp, 2 pp and 4 pp micro-batches that divide the replica's batch.
std::vector<Layout> enumerate_layouts(const Workload& w, int world);

/// Which layouts keep ZeRO's optimizer state on disk: none; a ZeRO layout's twin where the
/// layout itself does not fit (offload buys memory with time), and a ZeRO-3 layout's second twin
/// with the parameter shards there too where the first does not fit either; or only such
/// layouts, both twins of every ZeRO-3 layout and one of every other ZeRO layout.
enum class OffloadLayouts { None, WhereNeeded, Only };

/// The predictions of every layout, fitting ones first, each group fastest first; with offload
/// twins as `offload` says, where the machine's disk was measured and it computes on the CPU
/// (the plan prices no GPU run's offload: its copies to the host are not calibrated). ConfigError
/// for OffloadLayouts::Only on a machine without them.
std::vector<Prediction> rank_layouts(const Workload& w, const Machine& m, int world,
                                     OffloadLayouts offload = OffloadLayouts::WhereNeeded);

}  // namespace dtorch::plan
