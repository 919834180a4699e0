// `dtorch plan`: every layout of a job ranked by its predicted step time, with its predicted
// peak memory per rank and the flags that run it (Note [Cost model]); `dtorch plan calibrate`
// measures this machine's rates into a machine file (plan/machine.h).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/atomic_file.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/plan/cost_model.h"
#include "dtorch/report/out_of_memory.h"

namespace dtorch::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = double(1 << 30);

struct PlanFlags {
  std::string model, machine, format = "table";
  int nodes = 1, gpus_per_node = 0, nproc_per_node = 0, top = 20;
  int64_t global_batch = 0, seq_len = 0;
  double memory_per_rank_gib = 0;
};

std::string gib(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << bytes / kGiB;
  return s.str();
}

std::string seconds(double s) {
  std::ostringstream o;
  o << std::setprecision(3) << s;
  return o.str();
}

int run_plan(const PlanFlags& f) {
  DTORCH_CHECK_T(ConfigError, !f.model.empty(), "dtorch plan needs --model (a gpt-* name)");
  DTORCH_CHECK_T(ConfigError, !f.machine.empty(),
                 "dtorch plan needs --machine FILE: `dtorch plan calibrate --out FILE` measures "
                 "this machine, or write one for another by hand (docs in BENCHMARKS.md)");
  DTORCH_CHECK_T(ConfigError, (f.gpus_per_node > 0) != (f.nproc_per_node > 0),
                 "give the ranks per node once: --gpus-per-node G or --nproc-per-node P");
  DTORCH_CHECK_T(ConfigError, f.nodes >= 1, "--nodes must be >= 1 (got ", f.nodes, ")");
  DTORCH_CHECK_T(ConfigError, f.top >= 1, "--top must be >= 1 (got ", f.top, ")");
  plan::Machine m = plan::read_machine(f.machine);
  const int per_node = f.gpus_per_node > 0 ? f.gpus_per_node : f.nproc_per_node;
  m.ranks_per_node = per_node;
  if (f.memory_per_rank_gib > 0) m.memory_per_rank_bytes = f.memory_per_rank_gib * kGiB;
  const int world = f.nodes * per_node;
  const plan::Workload w = plan::workload_of(f.model, f.seq_len, f.global_batch);
  const std::vector<plan::Prediction> ranked = plan::rank_layouts(w, m, world);
  DTORCH_CHECK_T(ConfigError, !ranked.empty(), "no layout of ", world, " ranks runs ", f.model,
                 " at a global batch of ", f.global_batch,
                 ": use a --global-batch-size that the data-parallel degrees divide");
  const int shown = std::min<int>(f.top, static_cast<int>(ranked.size()));
  if (f.format == "json") {
    for (int i = 0; i < shown; ++i) {
      const plan::Prediction& p = ranked[i];
      std::cout << nlohmann::json{{"rank", i + 1},
                                  {"flags", plan::flags_of(p.layout, w)},
                                  {"dp", p.layout.dp},
                                  {"tp", p.layout.tp},
                                  {"pp", p.layout.pp},
                                  {"cp", p.layout.cp},
                                  {"predicted_step_s", p.step_s()},
                                  {"predicted_compute_s", p.compute_s},
                                  {"predicted_exposed_comm_s", p.exposed_comm_s},
                                  {"predicted_bubble_s", p.bubble_s},
                                  {"predicted_peak_gib", p.peak_bytes / kGiB},
                                  {"predicted_model_state_gib", p.model_state_bytes / kGiB},
                                  {"predicted_activation_gib", p.activation_bytes / kGiB},
                                  {"fits", p.fits}}
                       .dump()
                << "\n";
    }
    return 0;
  }
  int fitting = 0;
  for (const auto& p : ranked)
    fitting += p.fits;
  std::cout << f.model << ", " << w.seq_len << " tokens, global batch " << w.global_batch << ", on "
            << world << " rank(s) (" << f.nodes << " node(s) x " << per_node << ") of machine '"
            << m.name << "' (" << gib(m.memory_per_rank_bytes)
            << " GiB per rank): " << ranked.size() << " layouts, " << fitting << " fit\n";
  std::cout << std::setw(4) << "#" << std::setw(10) << "step s" << std::setw(10) << "compute"
            << std::setw(10) << "comm" << std::setw(10) << "bubble" << std::setw(11) << "peak GiB"
            << "  flags\n";
  for (int i = 0; i < shown; ++i) {
    const plan::Prediction& p = ranked[i];
    std::cout << std::setw(4) << i + 1 << std::setw(10) << seconds(p.step_s()) << std::setw(10)
              << seconds(p.compute_s) << std::setw(10) << seconds(p.exposed_comm_s) << std::setw(10)
              << seconds(p.bubble_s) << std::setw(11) << gib(p.peak_bytes) << "  "
              << plan::flags_of(p.layout, w)
              << (p.fits ? ""
                         : "  (does not fit: over by " +
                               gib(p.peak_bytes - m.memory_per_rank_bytes) + " GiB)")
              << "\n";
  }
  return 0;
}

// --- calibrate -------------------------------------------------------------------------

struct CalibrateFlags {
  std::string out;
  int nproc_per_node = 2;
};

// The slowest rank's seconds for `calls` calls of f, every rank starting together.
double time_calls(comm::Communicator& group, int calls, const std::function<void()>& f) {
  group.barrier("calibration");
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i)
    f();
  auto t =
      torch::tensor({std::chrono::duration<double>(Clock::now() - t0).count()}, torch::kDouble);
  group.allreduce(t, comm::ReduceOp::Max, "calibration time");
  return t.item<double>();
}

// Seconds per call of f over about `budget` seconds (3 calls at least). Every rank runs as
// many calls (f may be a collective): the count follows from one timed call, the same on all.
double time_per_call(comm::Communicator& group, double budget, const std::function<void()>& f) {
  f();  // warm-up
  const double one = time_calls(group, 1, f);
  const int calls = static_cast<int>(std::clamp(budget / std::max(one, 1e-7), 3.0, 1e5));
  return time_calls(group, calls, f) / calls;
}

// The matmul rate of one rank while every rank multiplies (they share the node, as in training).
double matmul_flops(comm::Communicator& world, torch::ScalarType dtype) {
  const int64_t n = 512;
  torch::Tensor a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
  const double s = time_per_call(world, 1.0, [&] { torch::mm(a, b); });
  return 2.0 * n * n * n / s;
}

plan::LinkCost measure(comm::Communicator& group, plan::Collective op) {
  const int n = group.size();
  auto run = [&](int64_t floats) {
    torch::Tensor full = torch::ones({floats});
    torch::Tensor part = torch::ones({floats / n});
    switch (op) {
      case plan::Collective::AllReduce:
        return time_per_call(group, 0.5, [&] { group.allreduce(full, comm::ReduceOp::Sum, "c"); });
      case plan::Collective::ReduceScatter:
        return time_per_call(group, 0.5, [&] {
          group.reduce_scatter(full.clone(), part, comm::ReduceOp::Sum, "c");
        });
      case plan::Collective::AllGather:
        return time_per_call(group, 0.5, [&] { group.allgather_into(full, part, "c"); });
      case plan::Collective::P2P:
        return time_per_call(group, 0.5, [&] {
          if (group.rank() == 0) group.send(full, 1);
          if (group.rank() == 1) group.recv(full, 0);
        });
    }
    return 0.0;
  };
  // 1 KiB per rank, and about 16 MiB; both whole multiples of n floats.
  const int64_t small = 256 * n, large = n * ((int64_t(4) << 20) / n);
  const double t_small = run(small), t_large = run(large);
  const double steps =
      op == plan::Collective::P2P ? 1 : (op == plan::Collective::AllReduce ? 2.0 : 1.0) * (n - 1);
  const double share = op == plan::Collective::P2P
                           ? 1
                           : (op == plan::Collective::AllReduce ? 2.0 : 1.0) * (n - 1) / n;
  plan::LinkCost l;
  l.ranks = n;
  l.latency_s = t_small / steps;
  l.bus_bytes_per_s = share * 4.0 * (large - small) / std::max(1e-9, t_large - t_small);
  return l;
}

int calibrate_worker(const CalibrateFlags& f) {
  const double base = double(report::process_memory().rss);
  auto world = comm::Communicator::from_env();
  const int W = world->size();
  DTORCH_CHECK_T(ConfigError, W >= 2,
                 "plan calibrate measures collectives between ranks: give --nproc-per-node 2 or "
                 "more");
  const auto t0 = Clock::now();
  plan::Machine m;
  m.name = launch::short_hostname() + " (cpu, " + std::to_string(W) + " ranks)";
  m.device = "cpu";
  m.ranks_per_node = W;
  m.base_bytes_per_rank = base;
  const report::ProcessMemory mem = report::process_memory();
  double total = double(mem.total);
  if (mem.cgroup_limit > 0) total = std::min(total, double(mem.cgroup_limit));
  m.memory_per_rank_bytes = total / W;
  if (world->rank() == 0) log::info("calibrating: matmul rates (fp32, bf16) on every rank");
  m.matmul_flops["fp32"] = matmul_flops(*world, torch::kFloat);
  try {
    m.matmul_flops["bf16"] = matmul_flops(*world, torch::kBFloat16);
  } catch (const c10::Error&) {  // a LibTorch without bf16 matmul on this device
    if (world->rank() == 0) log::warn("calibrating: no bf16 matmul here; the file has fp32 only");
  }
  {
    if (world->rank() == 0) log::info("calibrating: an AdamW step on every rank");
    torch::Tensor w = torch::zeros({int64_t(4) << 20}).requires_grad_();
    w.mutable_grad() = torch::randn({int64_t(4) << 20});
    torch::optim::AdamW adamw({w}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    m.adamw_seconds_per_parameter =
        time_per_call(*world, 1.0, [&] { adamw.step(); }) / double(w.numel());
  }
  std::vector<int> sizes;
  for (int s = 2; s < W; s *= 2)
    sizes.push_back(s);
  sizes.push_back(W);
  for (int s : sizes) {
    if (world->rank() == 0) log::info("calibrating: collectives over ", s, " ranks");
    std::vector<int> members;
    for (int r = 0; r < s; ++r)
      members.push_back(r);
    if (world->rank() < s) {
      auto group = s == W ? world : world->split(members, "calibrate" + std::to_string(s));
      for (plan::Collective op : {plan::Collective::AllReduce, plan::Collective::ReduceScatter,
                                  plan::Collective::AllGather})
        m.intra_node[op].push_back(measure(*group, op));
      if (s == 2)
        m.intra_node[plan::Collective::P2P].push_back(measure(*group, plan::Collective::P2P));
    }
    world->barrier("calibration");
  }
  if (world->rank() == 0) {
    const std::string json = plan::machine_json(m);
    if (auto failed = write_file_atomically(f.out, json.data(), json.size())) {
      DTORCH_FAIL(ConfigError, *failed);
    }
    log::info("wrote ", f.out, " in ", std::chrono::duration<double>(Clock::now() - t0).count(),
              " s");
  }
  world->barrier("calibration written");
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<PlanFlags>();
  auto* cmd = app.add_subcommand(
      "plan", "Rank every layout of a job by predicted step time and peak memory per rank");
  cmd->add_option("--model", f->model, "a gpt-* model");
  cmd->add_option("--machine", f->machine, "machine file (dtorch plan calibrate writes one)");
  cmd->add_option("--nodes", f->nodes)->capture_default_str();
  cmd->add_option("--gpus-per-node", f->gpus_per_node, "ranks per node");
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node, "ranks per node");
  cmd->add_option("--global-batch-size", f->global_batch, "sequences per optimizer step");
  cmd->add_option("--seq-len", f->seq_len, "tokens per sequence (default: the block size)");
  cmd->add_option("--memory-per-rank", f->memory_per_rank_gib,
                  "GiB per rank (default: the machine file's)");
  cmd->add_option("--format", f->format)
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->add_option("--top", f->top, "layouts shown")->capture_default_str();

  auto c = std::make_shared<CalibrateFlags>();
  auto* cal = cmd->add_subcommand("calibrate",
                                  "Measure this machine's matmul rates and collectives into a "
                                  "machine file for dtorch plan --machine");
  cal->add_option("--out", c->out, "the machine file to write (must not exist)")->required();
  cal->add_option("--nproc-per-node,--nproc_per_node", c->nproc_per_node)->capture_default_str();
  cal->callback([c, &exit_code] {
    DTORCH_CHECK_T(ConfigError, c->nproc_per_node >= 2, "plan calibrate: --nproc-per-node ",
                   c->nproc_per_node, " must be 2 or more (it measures collectives)");
    if (env::get("RANK")) {  // a worker (or a rank of a job started by a launcher)
      exit_code = calibrate_worker(*c);
      return;
    }
    DTORCH_CHECK_T(ConfigError, !paths::exists(c->out), "plan calibrate: --out ", c->out,
                   " exists; give a new path (a machine file is never overwritten)");
    SelfLaunch how;
    how.nproc_per_node = c->nproc_per_node;
    how.every_rank = false;
    auto launched = self_launch(how);
    exit_code = launched ? *launched : calibrate_worker(*c);
  });
  cmd->callback([f, cmd, &exit_code] {
    if (cmd->got_subcommand("calibrate")) return;
    exit_code = run_plan(*f);
  });
}

}  // namespace dtorch::tools
