// A machine as the cost model (Note [Cost model]) sees it: its matmul and convolution rates per
// dtype, each collective's latency and bandwidth per group size within a node and across nodes,
// its memory per rank and what one rank costs before it holds a model, and the disk an offloaded
// optimizer's state would use. `dtorch plan calibrate` measures one and writes it as JSON; a file
// for another machine can be written by hand.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtorch::plan {

/// "allreduce", "reduce_scatter", "allgather", "p2p" (a message between two ranks).
enum class Collective { AllReduce, ReduceScatter, AllGather, P2P };
const char* collective_name(Collective c);

/// One collective over a group of `ranks`: t = latency_s * steps + bus bytes / bus bandwidth
/// (steps: 2 (n-1) for a ring all-reduce, n-1 for reduce-scatter and all-gather, 1 for p2p;
/// bus bytes as NCCL's tests count them, Note [Cost model]).
/// The ring algorithm's steps for `op` over n ranks (2 (n-1), n-1, or 1 for p2p), and the bytes
/// each rank moves for a buffer of `bytes` (2 (n-1)/n of it, (n-1)/n, or all of it): what
/// LinkCost's latency and bandwidth are per, in calibration and in prediction alike.
double ring_steps(Collective op, int n);
double bus_bytes(Collective op, int n, double bytes);

struct LinkCost {
  int ranks = 2;
  double latency_s = 0;
  double bus_bytes_per_s = 0;
};

/// A matmul rate measured at `rows` rows (tokens): a linear layer's three products (forward,
/// input gradient, weight gradient) of a rows x 1024 input by a 1024 x 1024 weight.
struct RowsRate {
  int64_t rows = 0;
  double flops = 0;
};

/// Ring attention's own work in one layer, forward and backward, beyond the FLOPs and the
/// messages the cost model charges it (Note [Cost model]): a time per ring step (its blocks'
/// calls, the log-sum-exp merges, the handshake with the neighbours) and a time per attention
/// score (the passes over each block's scores and probabilities), and the forward's share of
/// the layer's time (what a recomputed forward pays again). 0 where not measured.
struct RingAttentionCost {
  double step_seconds = 0;
  double seconds_per_score = 0;
  double forward_share = 0;
};

/// The offload folder's disk as --offload-optimizer nvme uses it (Note [Optimizer state on disk]):
/// the bytes of optimizer state an offloaded AdamW step reads from there and writes back per
/// second of the step, every rank of a node stepping a shard of its own at once (they share the
/// disk, as in training). 0 where not measured: the plan proposes no layout with the optimizer's
/// state on disk.
struct OffloadDisk {
  std::string dir;  ///< where it was measured: the --offload-dir of the layouts' flags
  double state_bytes_per_s = 0;
  bool measured() const { return state_bytes_per_s > 0; }
};

struct Machine {
  std::string name;
  /// "cpu" or "cuda": what ran the measurements.
  std::string device = "cpu";
  int ranks_per_node = 1;
  double memory_per_rank_bytes = 0;
  /// Resident bytes of a rank before it builds a model (the runtime, the library).
  double base_bytes_per_rank = 0;
  /// Sustained matmul floating-point operations per second of one rank, by dtype ("fp32",
  /// "bf16").
  std::map<std::string, double> matmul_flops;
  /// The same by the rows of the product, by dtype, fewest rows first (optional: a hand-written
  /// file may give matmul_flops alone). Few rows (a small micro-batch) run below the peak rate.
  std::map<std::string, std::vector<RowsRate>> matmul_by_rows;
  /// Sustained convolution floating-point operations per second of one rank, by dtype: a 3x3
  /// convolution layer's three products (forward, input gradient, weight gradient), channels to
  /// as many channels, every rank at once (optional: only a model with convolutions reads it).
  std::map<std::string, double> conv_flops;
  /// Seconds per byte a step allocates afresh beyond writing it: the page faults of memory the
  /// allocator returned to the system and takes back (large tensors on a CPU; 0 on a GPU, whose
  /// caching allocator keeps its blocks).
  double first_touch_seconds_per_byte = 0;
  /// Seconds an AdamW step takes per fp32 parameter on one rank, as training steps it (the fused
  /// kernels of Note [Fused optimizers]; memory-bound: it reads and writes the weights, the
  /// gradients and both moments).
  double adamw_seconds_per_parameter = 0;
  RingAttentionCost ring_attention;
  /// How much longer a rank's compute takes when it meets another rank after every layer's
  /// worth (tensor and context parallelism's collectives) than when they run apart: the wait
  /// for the slower of ranks that share a node's cores, caches and memory. 0 where not
  /// measured.
  double lockstep_fraction = 0;
  OffloadDisk offload_disk;
  /// Per collective, measured group sizes, within one node and across nodes (empty: not
  /// measured).
  std::map<Collective, std::vector<LinkCost>> intra_node, inter_node;
  /// The same across nodes while every rank of a node runs a group of its own at once, one rank
  /// of each node each (hybrid sharding's replicas: their flows share a node's links). Optional:
  /// inter_node's one group at a time stands in where absent.
  std::map<Collective, std::vector<LinkCost>> inter_node_concurrent;
  /// The fraction of the data-parallel strategy's communication hidden behind backward
  /// ("ddp", "zero1", "zero2", "zero3"); tensor-parallel collectives are never hidden.
  std::map<std::string, double> overlap;

  /// Seconds for `op` over `ranks` ranks on `bytes`, across nodes or not. ConfigError when the
  /// machine has no measurement for it.
  double seconds(Collective op, int ranks, double bytes, bool across_nodes) const;
  /// Seconds for `op` over `ranks` ranks on `bytes` across nodes while every rank of a node runs
  /// one at once: inter_node_concurrent's measurement, else inter_node's.
  double concurrent_seconds(Collective op, int ranks, double bytes) const;
  /// The matmul rate for `dtype` at `rows` rows: interpolated in log(rows) between the
  /// measured rows (the nearest end outside them), matmul_flops where none were measured or
  /// `rows` is 0. ConfigError naming the file's rates when it has none for `dtype`.
  double flops(const std::string& dtype, double rows = 0) const;
  /// The convolution rate for `dtype`. ConfigError naming the file's rates and the fix when it
  /// has none for `dtype`.
  double convolution_flops(const std::string& dtype) const;
};

/// Reads a machine file; ConfigError naming the file, the field and the fix for a missing or
/// malformed one.
Machine read_machine(const std::string& path);
/// The machine as JSON (what read_machine reads).
std::string machine_json(const Machine& m);

}  // namespace dtorch::plan
