// Calibration's measurements, each timed by every rank of its group at once as training runs
// them, and the rounds of them whose medians make a machine file (plan/machine.h).
#include "dtorch/plan/calibrate.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/device.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/machine_load.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/optim/fused.h"
#include "dtorch/parallel/cp/attention.h"
#include "dtorch/parallel/zero/offload.h"
#include "dtorch/plan/cost_model.h"
#include "dtorch/report/out_of_memory.h"

namespace dtorch::plan {
namespace {

using Clock = std::chrono::steady_clock;

// The slowest rank's seconds for `calls` calls of f, every rank starting together; a GPU's
// queued work counts (synchronized before the clock is read).
double time_calls(comm::Communicator& group, const Bench& b, int calls,
                  const std::function<void()>& f) {
  synchronize(b.device);
  group.barrier("calibration");
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i)
    f();
  synchronize(b.device);
  auto t =
      torch::tensor({std::chrono::duration<double>(Clock::now() - t0).count()}, torch::kDouble);
  group.allreduce(t, comm::ReduceOp::Max, "calibration time");
  return t.item<double>();
}

// How many calls of f take about `budget` seconds (times the bench's length; `least` at least),
// from one timed call after a warm-up: the same count on every rank, so every rank runs as many
// (f may be a collective).
int calls_for(comm::Communicator& group, const Bench& b, double budget, int least,
              const std::function<void()>& f) {
  f();  // warm-up
  const double one = time_calls(group, b, 1, f);
  return static_cast<int>(std::clamp(budget * b.seconds / std::max(one, 1e-7), double(least), 1e5));
}

// Seconds per call of f over about `budget` seconds (`least` calls at least).
double time_per_call(comm::Communicator& group, const Bench& b, double budget,
                     const std::function<void()>& f, int least = 3) {
  const int calls = calls_for(group, b, budget, least, f);
  return time_calls(group, b, calls, f) / calls;
}

// The median of get(round) over the rounds.
template <class T, class Get>
double median_of(const std::vector<T>& rounds, Get get) {
  std::vector<double> v;
  for (const T& r : rounds)
    v.push_back(get(r));
  return median(std::move(v));
}

// The matmul rate of one rank while every rank multiplies (they share the node, as in training).
double matmul_flops(comm::Communicator& world, const Bench& bench, torch::ScalarType dtype) {
  const int64_t n = bench.square;
  torch::Tensor a = torch::randn({n, n}, bench.options()).to(dtype);
  torch::Tensor b = torch::randn({n, n}, bench.options()).to(dtype);
  const double s = time_per_call(world, bench, 1.0, [&] { torch::mm(a, b); });
  return 2.0 * n * n * n / s;
}

// Seconds for a linear layer's three products at `rows` rows (forward, input and weight
// gradient), every rank at once: what a micro-batch of that many tokens sees (Note [Cost
// model]). They take 3 x 2 rows width^2 operations.
double linear_seconds(comm::Communicator& world, const Bench& b, torch::ScalarType dtype,
                      int64_t rows) {
  const int64_t n = b.width;
  torch::Tensor x = torch::randn({rows, n}, b.options()).to(dtype);
  torch::Tensor w = torch::randn({n, n}, b.options()).to(dtype);
  torch::Tensor g = torch::randn({rows, n}, b.options()).to(dtype);
  return time_per_call(world, b, 0.4, [&] {
    torch::mm(x, w);
    torch::mm(g, w.t());
    torch::mm(x.t(), g);
  });
}

// The convolution rate of one rank while every rank convolves: the bench's 3x3 convolution
// layer's three products (forward, input and weight gradients), as backward makes them. Each
// takes 2 batch side^2 channels^2 9 operations. A call may be slow (bf16 on a CPU without bf16
// instructions takes about 12 times fp32's time), so a timing is one call at least, of about
// 0.3 s.
double conv_flops(comm::Communicator& world, const Bench& b, torch::ScalarType dtype) {
  const int64_t n = b.conv_batch, c = b.conv_channels, side = b.conv_side;
  torch::Tensor x = torch::randn({n, c, side, side}, b.options()).to(dtype).requires_grad_();
  torch::Tensor w = torch::randn({c, c, 3, 3}, b.options()).to(dtype).requires_grad_();
  torch::Tensor g = torch::randn({n, c, side, side}, b.options()).to(dtype);
  auto layer = [&] { torch::conv2d(x, w, {}, 1, 1).backward(g); };
  return 3 * 2.0 * double(n * side * side * c * c * 9) / time_per_call(world, b, 0.3, layer, 1);
}

// Seconds per byte that a fresh allocation costs beyond writing it: the bench's first-touch
// buffer allocated and filled each call, against the same bytes filled in place (about 0 on a
// GPU, whose caching allocator keeps its blocks).
double first_touch_seconds_per_byte(comm::Communicator& world, const Bench& b) {
  const int64_t floats = b.first_touch_floats;
  torch::Tensor kept = torch::empty({floats}, b.options());
  const double reused = time_per_call(world, b, 0.5, [&] { kept.fill_(1); });
  const double fresh =
      time_per_call(world, b, 0.5, [&] { torch::empty({floats}, b.options()).fill_(1); });
  return std::max(0.0, fresh - reused) / (4.0 * floats);
}

// One round of every rate calibrate measures, as this rank saw it (a rank outside a group or
// the ring's pairs leaves its part empty).
struct Round {
  ComputeRates rates;
  OffloadDisk disk;
  std::map<Collective, std::vector<LinkCost>> intra, inter, concurrent;
  RingSeconds ring;
  double lockstep = 0;
};

// Each rate's median over the rounds into `m`; ring attention's and the lockstep's where
// `paired` (this rank ran the ring, and the ranks shared a node, so every rank timed the
// lockstep: rank 0's pair is the one whose point-to-point link was measured).
void set_medians(Machine& m, const std::vector<Round>& rounds, const Bench& bench, bool paired) {
  auto of = [&](auto get) { return median_of(rounds, get); };
  // Named variables, not structured bindings: C++17 lets no lambda capture a binding.
  for (const auto& by_rows : rounds.front().rates.by_rows) {
    const std::string& name = by_rows.first;
    const auto& rates = by_rows.second;
    m.matmul_flops[name] = of([&](const Round& r) { return r.rates.flops.at(name); });
    m.conv_flops[name] = of([&](const Round& r) { return r.rates.conv.at(name); });
    for (size_t i = 0; i < rates.size(); ++i)
      m.matmul_by_rows[name].push_back(
          {rates[i].rows, of([&](const Round& r) { return r.rates.by_rows.at(name)[i].flops; })});
  }
  m.first_touch_seconds_per_byte = of([](const Round& r) { return r.rates.first_touch; });
  m.adamw_seconds_per_parameter = of([](const Round& r) { return r.rates.adamw; });
  if (!bench.offload_dir.empty()) {
    m.offload_disk.dir = bench.offload_dir;
    m.offload_disk.state_bytes_per_s = of([](const Round& r) { return r.disk.state_bytes_per_s; });
  }
  for (const auto& which : {std::pair{&Round::intra, &m.intra_node},
                            {&Round::inter, &m.inter_node},
                            {&Round::concurrent, &m.inter_node_concurrent}}) {
    const auto links = which.first;
    for (const auto& by_op : rounds.front().*links) {
      const Collective op = by_op.first;
      const std::vector<LinkCost>& costs = by_op.second;
      for (size_t k = 0; k < costs.size(); ++k) {
        LinkCost l = costs[k];
        l.latency_s = of([&](const Round& r) { return (r.*links).at(op)[k].latency_s; });
        l.bus_bytes_per_s =
            of([&](const Round& r) { return (r.*links).at(op)[k].bus_bytes_per_s; });
        (*which.second)[op].push_back(l);
      }
    }
  }
  if (!paired) return;
  RingSeconds ring;
  for (size_t k = 0; k < bench.ring_tokens.size(); ++k)
    ring.both.push_back(of([&](const Round& r) { return r.ring.both[k]; }));
  ring.forward = of([](const Round& r) { return r.ring.forward; });
  m.ring_attention = ring_attention_cost(ring, bench, m);
  m.lockstep_fraction = of([](const Round& r) { return r.lockstep; });
}

// The groups the collectives are measured over, over `order`'s first 2, 4, ... ranks and all of
// them (the whole job's group where that is all of it), made by every rank of `world` at once:
// each with its size, null where this rank is not a member.
using Groups = std::vector<std::pair<int, std::shared_ptr<comm::Communicator>>>;
Groups groups_over(const std::shared_ptr<comm::Communicator>& world, const std::vector<int>& order,
                   const std::string& name) {
  const int n = static_cast<int>(order.size());
  std::vector<int> sizes;
  for (int s = 2; s < n; s *= 2)
    sizes.push_back(s);
  if (n >= 2) sizes.push_back(n);
  Groups out;
  for (int s : sizes) {
    std::vector<int> members(order.begin(), order.begin() + s);
    std::sort(members.begin(), members.end());
    std::shared_ptr<comm::Communicator> group;
    if (std::binary_search(members.begin(), members.end(), world->rank()))
      group = s == world->size() ? world : world->split(members, name + std::to_string(s));
    out.emplace_back(s, group);
    world->barrier("calibration groups");
  }
  return out;
}

}  // namespace

Bench bench_for(at::Device d, bool quick) {
  Bench b;
  b.device = d;
  if (d.is_cuda()) {
    b.square = 8192;
    b.width = 4096;
    b.rows = {256, 1024, 4096, 16384, 65536};
    b.conv_batch = 32, b.conv_channels = 256, b.conv_side = 56;
    b.large_floats = int64_t(64) << 20;
    b.ring_heads = 16, b.ring_head_dim = 128;
    b.ring_tokens = {1024, 4096};
    b.lockstep_rows = 4096;
  }
  if (quick) {  // the collectives keep their large buffer: a smaller one's time is mostly noise
    b.square = std::min<int64_t>(b.square, 256);
    b.width = std::min<int64_t>(b.width, 256);
    b.rows = {16, 64, 256};
    b.conv_batch = 2, b.conv_channels = 16, b.conv_side = 14;
    b.first_touch_floats = int64_t(1) << 20;
    b.disk_bytes = int64_t(16) << 20;
    b.disk_piece_bytes = int64_t(4) << 20;
    b.seconds = 0.1;
    b.rounds = 1;
    b.lockstep_trials = 3;
  }
  return b;
}

ComputeRates compute_rates(comm::Communicator& world, const Bench& bench,
                           const ComputeRates* first) {
  ComputeRates r;
  for (auto [name, dtype] : {std::pair{"fp32", torch::kFloat}, {"bf16", torch::kBFloat16}}) {
    if (first && !first->flops.count(name)) continue;
    try {
      r.flops[name] = matmul_flops(world, bench, dtype);
      for (size_t i = 0; i < bench.rows.size(); ++i) {
        if (first && i == first->by_rows.at(name).size()) break;
        const int64_t rows = bench.rows[i];
        const double s = linear_seconds(world, bench, dtype, rows);
        r.by_rows[name].push_back({rows, 3 * 2.0 * rows * bench.width * bench.width / s});
        if (!first && s > 0.25) break;
      }
      r.conv[name] = conv_flops(world, bench, dtype);
    } catch (const c10::Error&) {
      if (dtype == torch::kFloat) throw;
      if (world.rank() == 0)
        log::warn("calibrating: no bf16 matmul or convolution here; the file has fp32 only");
      r.flops.erase(name);
      r.by_rows.erase(name);
      r.conv.erase(name);
    }
  }
  r.first_touch = first_touch_seconds_per_byte(world, bench);
  torch::Tensor w = torch::zeros({bench.large_floats}, bench.options()).requires_grad_();
  w.mutable_grad() = torch::randn({bench.large_floats}, bench.options());
  optim::FusedAdamW adamw({w}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  r.adamw = time_per_call(world, bench, 1.0, [&] { adamw.step(); }) / double(w.numel());
  return r;
}

OffloadDisk offload_disk(comm::Communicator& world, const Bench& b) {
  // AdamW's two fp32 moments: 8 bytes a parameter.
  const int64_t n = b.disk_bytes / 8;
  torch::Tensor w = torch::zeros({n}).requires_grad_();
  w.mutable_grad() = torch::randn({n});
  optim::FusedAdamW adamw({w}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  zero::OffloadOptions o;
  o.dir = b.offload_dir;
  o.name = str("dtorch-calibrate-", ::getpid(), "-rank", world.rank(), ".swap");
  o.buffer_bytes = static_cast<size_t>(b.disk_piece_bytes);
  zero::OptimizerOffload offloaded(adamw, {w}, o);
  offloaded.step();  // makes the state and writes it; every later step reads it back too
  const double s = time_per_call(
      world, b, 1.0, [&] { offloaded.step(); }, 2);
  OffloadDisk d;
  d.dir = b.offload_dir;
  d.state_bytes_per_s = 2.0 * double(n * 8) / s;
  return d;
}

RingSeconds ring_attention_seconds(const std::shared_ptr<comm::Communicator>& pair,
                                   const Bench& b) {
  RingSeconds s;
  for (int64_t tokens : b.ring_tokens) {
    torch::Tensor qkv =
        torch::randn({3, 1, b.ring_heads, tokens, b.ring_head_dim}, b.options()).requires_grad_();
    torch::Tensor grad = torch::randn({1, b.ring_heads, tokens, b.ring_head_dim}, b.options());
    s.both.push_back(time_per_call(
        *pair, b, 0.5, [&] { cp::ring_attention(qkv, pair, /*causal=*/true).backward(grad); }));
    if (s.both.size() == 1)
      s.forward =
          time_per_call(*pair, b, 0.5, [&] { cp::ring_attention(qkv, pair, /*causal=*/true); });
  }
  return s;
}

RingAttentionCost ring_attention_cost(const RingSeconds& measured, const Bench& b,
                                      const Machine& m) {
  std::vector<double> rest, scores;
  for (size_t k = 0; k < b.ring_tokens.size(); ++k) {
    const AttentionShape layer{1, b.ring_heads, b.ring_tokens[k], b.ring_head_dim, 2, 4};
    const RingAttentionTime charged = ring_attention_time(m, layer, false, false);
    rest.push_back(std::max(0.0, measured.both[k] - charged.attention_s - charged.exposed_s));
    scores.push_back(attention_scores(layer));
  }
  RingAttentionCost c;
  c.seconds_per_score = std::max(0.0, (rest[1] - rest[0]) / (scores[1] - scores[0]));
  c.step_seconds = std::max(0.0, rest[0] - c.seconds_per_score * scores[0]) / 2;
  c.forward_share = std::clamp(measured.forward / measured.both[0], 0.0, 1.0);
  return c;
}

// 40 segments of a linear layer's three products at the bench's rows, with and without a
// one-float all-reduce over `pair` after each (a layer under tensor or context parallelism). Every
// rank of the job runs the same mode at once, as a job's tensor-parallel groups do (timed by pairs,
// one pair's meetings overlapped another's work apart). The wait comes and goes with how the ranks
// happen to share the cores: at 4 ranks on 2 cores one timing each way read from -0.14 to +0.43,
// and one of each a round gave 0 to 0.29 over six rounds, so the fraction is the median of the
// bench's lockstep_trials (7) timings each way, taken in turn. The all-reduces' own time
// (microseconds each, against milliseconds a segment) counts in the wait.
double lockstep_fraction(comm::Communicator& world, comm::Communicator* pair, const Bench& b) {
  constexpr int kSegments = 40;
  const int64_t n = b.width;
  const int64_t rows = b.lockstep_rows;
  torch::Tensor x = torch::randn({rows, n}, b.options()), w = torch::randn({n, n}, b.options()),
                g = torch::randn({rows, n}, b.options()), one = torch::zeros({1}, b.options());
  auto segments = [&](bool meet) {
    for (int i = 0; i < kSegments; ++i) {
      torch::mm(x, w);
      torch::mm(g, w.t());
      torch::mm(x.t(), g);
      if (meet && pair) pair->allreduce(one, comm::ReduceOp::Sum, "lockstep");
    }
  };
  // Each timing 0.15 s or one call, whichever is longer.
  const int calls = calls_for(world, b, 0.15, 1, [&] { segments(false); });
  std::vector<double> fractions;
  for (int i = 0; i < b.lockstep_trials; ++i) {
    const double apart = time_calls(world, b, calls, [&] { segments(false); });
    const double together = time_calls(world, b, calls, [&] { segments(true); });
    fractions.push_back(together / apart - 1);
  }
  return std::max(0.0, median(fractions));
}

LinkCost link_cost(comm::Communicator& group, const Bench& b, Collective op) {
  const int n = group.size();
  auto run = [&](int64_t floats) {
    torch::Tensor full = torch::ones({floats}, b.options());
    torch::Tensor part = torch::ones({floats / n}, b.options());
    switch (op) {
      case Collective::AllReduce:
        return time_per_call(group, b, 0.5,
                             [&] { group.allreduce(full, comm::ReduceOp::Sum, "c"); });
      case Collective::ReduceScatter:  // `full` is scratch: its values do not matter
        return time_per_call(group, b, 0.5,
                             [&] { group.reduce_scatter(full, part, comm::ReduceOp::Sum, "c"); });
      case Collective::AllGather:
        return time_per_call(group, b, 0.5, [&] { group.allgather_into(full, part, "c"); });
      case Collective::P2P:
        return time_per_call(group, b, 0.5, [&] {
          if (group.rank() == 0) group.send(full, 1);
          if (group.rank() == 1) group.recv(full, 0);
        });
    }
    return 0.0;
  };
  // 1 KiB per rank, and the large buffer (16 MiB on a CPU); both whole multiples of n floats.
  const int64_t small = 256 * n, large = n * (b.large_floats / n);
  const double t_small = run(small), t_large = run(large);
  LinkCost l;
  l.ranks = n;
  l.latency_s = t_small / ring_steps(op, n);
  l.bus_bytes_per_s = bus_bytes(op, n, 4.0 * (large - small)) / std::max(1e-9, t_large - t_small);
  return l;
}

std::vector<std::vector<int>> ranks_by_node(const std::vector<int>& node_of_rank) {
  std::vector<std::vector<int>> nodes;
  std::map<int, size_t> index;  // node_rank -> its place in nodes
  for (int r = 0; r < static_cast<int>(node_of_rank.size()); ++r) {
    auto [at, added] = index.emplace(node_of_rank[r], nodes.size());
    if (added) nodes.emplace_back();
    nodes[at->second].push_back(r);
  }
  for (const auto& node : nodes)
    DTORCH_CHECK_T(ConfigError, node.size() == nodes.front().size(),
                   "plan calibrate: the nodes run different numbers of ranks (",
                   nodes.front().size(), " and ", node.size(),
                   "); start every node with the same --nproc-per-node");
  return nodes;
}

std::optional<Machine> calibrate(const std::shared_ptr<comm::Communicator>& world,
                                 const Bench& bench, double base_bytes_per_rank) {
  const int W = world->size();
  DTORCH_CHECK_T(ConfigError, W >= 2,
                 "plan calibrate measures collectives between ranks: give --nproc-per-node 2 or "
                 "more");
  const bool gpu = bench.device.is_cuda();
  DTORCH_CHECK_T(
      ConfigError, !gpu || bench.offload_dir.empty(),
      "plan calibrate: --offload-dir measures the optimizer's state on disk for a run "
      "on the CPU, and the plan prices no GPU run's offload: leave it out with --device cuda");
  Machine m;
  m.device = gpu ? "cuda" : "cpu";
  std::vector<int> node_of_rank;
  for (int r = 0; r < W; ++r)
    node_of_rank.push_back(world->node_of(r));
  const std::vector<std::vector<int>> nodes = ranks_by_node(node_of_rank);
  const int per_node = static_cast<int>(nodes.front().size());
  m.name = launch::short_hostname() + " (" + (gpu ? gpu_name(bench.device) : "cpu") + ", " +
           (nodes.size() > 1 ? std::to_string(nodes.size()) + " nodes x " : "") +
           std::to_string(per_node) + " ranks)";
  m.ranks_per_node = per_node;
  if (gpu) {  // the caching allocator's reserve is what a rank's GPU memory holds
    m.memory_per_rank_bytes = double(device_memory(bench.device).total);
  } else {
    m.base_bytes_per_rank = base_bytes_per_rank;
    const report::ProcessMemory mem = report::process_memory();
    double total = double(mem.total);
    if (mem.cgroup_limit > 0) total = std::min(total, double(mem.cgroup_limit));
    m.memory_per_rank_bytes = total / per_node;
  }
  // Within rank 0's node its first ranks; across nodes, a list taking one rank of each node in
  // turn (as a data-parallel group strides across the nodes under tensor parallelism).
  const Groups intra = groups_over(world, nodes.front(), "calibrate-intra");
  Groups inter;
  if (nodes.size() > 1) {
    std::vector<int> across;
    for (int i = 0; i < per_node; ++i)
      for (const auto& node : nodes)
        across.push_back(node[i]);
    inter = groups_over(world, across, "calibrate-inter");
  }
  // And every rank of a node at once, each with the ranks at its place on the other nodes
  // (hybrid sharding's replicas): rank 0's group is the one recorded.
  std::shared_ptr<comm::Communicator> concurrent;
  if (nodes.size() > 1 && per_node > 1) {
    for (int i = 0; i < per_node; ++i) {
      std::vector<int> members;
      for (const auto& node : nodes)
        members.push_back(node[i]);
      std::sort(members.begin(), members.end());
      if (std::binary_search(members.begin(), members.end(), world->rank()))
        concurrent = world->split(members, "calibrate-concurrent" + std::to_string(i));
    }
  }
  if (per_node < 2 && world->rank() == 0)
    log::warn(
        "calibrating: one rank per node, so no measurements within a node (a plan with "
        "ranks sharing a node needs them)");
  // Ring attention runs over pairs of each node's ranks, in its order, every pair at once.
  std::shared_ptr<comm::Communicator> pair;
  for (const auto& node : nodes)
    for (size_t i = 0; i + 1 < node.size(); i += 2) {
      std::vector<int> members = {node[i], node[i + 1]};
      std::sort(members.begin(), members.end());
      if (world->rank() == members[0] || world->rank() == members[1])
        pair =
            W == 2 ? world : world->split(members, "calibrate-ring" + std::to_string(members[0]));
    }

  // What else rank 0's node runs while it measures (Note [Others on the machine]).
  const MachineLoad load;
  const bool first_node = std::count(nodes.front().begin(), nodes.front().end(), world->rank());
  const double cpu0 = own_cpu_seconds();
  // Every rate, bench.rounds times over, one round after the other: a spell of the machine that
  // slows one round moves no median.
  std::vector<Round> rounds(bench.rounds);
  for (int i = 0; i < bench.rounds; ++i) {
    Round& r = rounds[i];
    const std::string round =
        "(round " + std::to_string(i + 1) + " of " + std::to_string(bench.rounds) + ")";
    if (world->rank() == 0)
      log::info("calibrating on ", bench.device.str(), " ", round,
                ": matmul and convolution rates (fp32, bf16), freshly allocated memory and an "
                "AdamW step on every rank");
    r.rates = compute_rates(*world, bench, i == 0 ? nullptr : &rounds.front().rates);
    if (!bench.offload_dir.empty()) {
      if (world->rank() == 0)
        log::info("calibrating ", round, ": an AdamW step with its ", bench.disk_bytes >> 20,
                  " MiB of state on disk in ", bench.offload_dir, " on every rank");
      r.disk = offload_disk(*world, bench);
    }
    auto measure_groups = [&](const Groups& groups, const std::string& where,
                              std::map<Collective, std::vector<LinkCost>>& into) {
      for (const auto& [size, group] : groups) {
        if (world->rank() == 0)
          log::info("calibrating ", round, ": collectives over ", size, " ranks ", where);
        if (group) {
          for (Collective op :
               {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather})
            into[op].push_back(link_cost(*group, bench, op));
          if (size == 2) into[Collective::P2P].push_back(link_cost(*group, bench, Collective::P2P));
        }
        world->barrier("calibration");
      }
    };
    measure_groups(intra, "within a node", r.intra);
    measure_groups(inter, "across nodes", r.inter);
    if (concurrent) {
      if (world->rank() == 0)
        log::info("calibrating ", round,
                  ": allreduce across nodes by every rank of a node at once");
      r.concurrent[Collective::AllReduce].push_back(
          link_cost(*concurrent, bench, Collective::AllReduce));
      world->barrier("calibration");
    }
    if (per_node >= 2) {
      if (world->rank() == 0)
        log::info("calibrating ", round,
                  ": ring attention and ranks in lockstep over pairs of ranks within a node");
      if (pair) r.ring = ring_attention_seconds(pair, bench);
      world->barrier("calibration");
      r.lockstep = lockstep_fraction(*world, pair.get(), bench);
    }
  }
  torch::Tensor node_cpu =
      torch::full({1}, first_node ? own_cpu_seconds() - cpu0 : 0.0, bench.options());
  world->allreduce(node_cpu, comm::ReduceOp::Sum, "calibration's CPU time");
  if (world->rank() != 0) return std::nullopt;
  const double others = load.others_share(node_cpu.item<double>());
  if (noticeable(others))
    log::warn(others_took(others, "calibrating"),
              "; every rate includes them (calibrate on an otherwise idle machine)");
  set_medians(m, rounds, bench, pair != nullptr);
  return m;
}

}  // namespace dtorch::plan
