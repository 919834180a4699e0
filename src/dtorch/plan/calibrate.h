// Calibration: this machine's rates measured by the ranks of a job (matmuls by rows,
// convolutions, fresh memory, an AdamW step, the offload folder's disk, each collective within
// and across nodes, ring attention, ranks in lockstep) into the machine file the cost model reads
// (plan/machine.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/plan/machine.h"

namespace dtorch::comm {
class Communicator;
}

namespace dtorch::plan {

/// Where calibration runs and how much it measures: each rank's device (its GPU, or the CPU),
/// the sizes measured there (a GPU needs larger products and buffers to reach its rates), and
/// how long and how often each rate is timed.
struct Bench {
  at::Device device = at::kCPU;
  int64_t square = 512;  ///< the matmul_flops product's side
  int64_t width = 1024;  ///< the linear layer's weight side
  /// The rows the linear layer's rate is measured at, fewest first.
  std::vector<int64_t> rows = {16, 64, 256, 1024, 4096};
  /// The convolution rate's layer: a 3x3 convolution of conv_channels to as many, padding 1,
  /// over conv_batch images of conv_side (a ResNet stage's).
  int64_t conv_batch = 4, conv_channels = 64, conv_side = 28;
  int64_t large_floats = int64_t(4) << 20;         ///< a collective's large buffer per rank
  int64_t first_touch_floats = int64_t(16) << 20;  ///< a fresh allocation's (64 MiB)
  /// Ring attention's layer: heads of head_dim, at two sizes of the rank's tokens.
  int64_t ring_heads = 12, ring_head_dim = 64;
  std::vector<int64_t> ring_tokens = {32, 128};
  int64_t lockstep_rows = 64;  ///< a segment's rows: a layer's work at a small micro-batch
  /// The folder whose disk --offload-optimizer nvme would use ("": not measured), and the
  /// optimizer state each rank steps there: disk_bytes, in pieces of disk_piece_bytes.
  std::string offload_dir;
  int64_t disk_bytes = int64_t(256) << 20;
  int64_t disk_piece_bytes = int64_t(32) << 20;
  /// Each timing's length, as a multiple of the lengths calibrate.cpp gives each rate.
  double seconds = 1;
  /// Every rate is measured this many times over, and the file keeps each one's median.
  int rounds = 3;
  /// Timings each way of lockstep_fraction, whose median it keeps.
  int lockstep_trials = 7;
  c10::TensorOptions options() const { return c10::TensorOptions().device(device); }
};

/// The bench for `device`: a CPU's, or a GPU's larger sizes. `quick`: tiny products, one round
/// and a tenth of the time (a file in seconds, with every field, for tests and for trying the
/// command; its rates are rough).
Bench bench_for(at::Device device, bool quick = false);

/// Measures this machine over `world` (2 ranks or more; every node must run as many) on
/// bench.device, and returns what the machine file holds on rank 0 (nullopt on the others).
/// `base_bytes_per_rank`: a rank's resident bytes before it met the others, the file's base on
/// a CPU. Collectives are measured within rank 0's node over its first 2, 4, ... ranks and all
/// of them, and across nodes over the same counts taking one rank of each node in turn, and an
/// allreduce across nodes by every rank of a node at once (one rank of each node a group); ring
/// attention and the lockstep over pairs of a node's ranks. Rank 0 logs each step, and warns
/// when other processes took a noticeable share of its node's CPU meanwhile (Note [Others on
/// the machine]).
std::optional<Machine> calibrate(const std::shared_ptr<comm::Communicator>& world,
                                 const Bench& bench, double base_bytes_per_rank);

// --- its parts, each measured by every rank of its group at once -----------------------

/// The rates every rank measures alone, at once (they share the node, as in training).
struct ComputeRates {
  std::map<std::string, double> flops, conv;  ///< by dtype ("fp32", "bf16")
  std::map<std::string, std::vector<RowsRate>> by_rows;
  double first_touch = 0;  ///< seconds per byte
  double adamw = 0;        ///< seconds per parameter
};

/// One round of the rates. The first (`first` null) measures fp32 and bf16, the matmul by rows
/// while a call takes under a quarter second (bf16 on a CPU is slow), and the convolution;
/// fp32 alone where this LibTorch has no bf16 matmul or convolution on the device. The later
/// ones measure what the first did.
ComputeRates compute_rates(comm::Communicator& world, const Bench& bench,
                           const ComputeRates* first);

/// One collective's latency and bus bandwidth over `group`, from its time at 1 KiB and at the
/// bench's large buffer per rank (a P2P message goes from the group's rank 0 to its rank 1).
LinkCost link_cost(comm::Communicator& group, const Bench& bench, Collective op);

/// The offload folder's disk (OffloadDisk), every rank of `world` at once: each steps AdamW over a
/// parameter whose state is the bench's disk_bytes, kept on disk there by the offload itself
/// (Note [Optimizer state on disk]) in pieces of disk_piece_bytes; the bytes a step reads and
/// writes back over the slowest rank's step. (Read and written apart, a file written and then read
/// back, a 2-core machine's disk moved gpt-small's ZeRO-1 shard in 1.8 s; offloaded steps moved it
/// in about 0.7 s.) ConfigError naming the folder when the offload cannot use it.
OffloadDisk offload_disk(comm::Communicator& world, const Bench& bench);

/// A causal ring attention layer's seconds over a group of 2, every pair of the node's ranks
/// running at once: forward and backward at each of the bench's sizes (`both`, in ring_tokens'
/// order), and forward alone at the first (the forward's share).
struct RingSeconds {
  std::vector<double> both;
  double forward = 0;
};
RingSeconds ring_attention_seconds(const std::shared_ptr<comm::Communicator>& pair,
                                   const Bench& bench);

/// Ring attention's own work (RingAttentionCost): what a layer took beyond the cost model's
/// charge for its FLOPs and messages (m's rates); the time per score from the two sizes'
/// difference, the time per step from the rest at the smaller size.
RingAttentionCost ring_attention_cost(const RingSeconds& measured, const Bench& bench,
                                      const Machine& m);

/// How much longer compute takes when ranks meet after every segment of it than when they run
/// apart (Machine::lockstep_fraction), every rank of `world` in the same mode at once; a rank
/// of no `pair` (null) computes alongside, never meeting.
double lockstep_fraction(comm::Communicator& world, comm::Communicator* pair, const Bench& bench);

/// The job's ranks by node, given each rank's node (the launcher's node_rank): each node's in
/// rank order, rank 0's node first. ConfigError when the nodes run different numbers of ranks
/// (a machine file has one ranks_per_node).
std::vector<std::vector<int>> ranks_by_node(const std::vector<int>& node_of_rank);

/// The middle value of `v` (the upper of the two middle ones for an even count); `v` not empty.
inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace dtorch::plan
