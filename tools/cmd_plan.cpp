// `dtorch plan`: every layout of a job ranked by its predicted step time, with its predicted
// peak memory per rank and the flags that run it (Note [Cost model]); `dtorch plan calibrate`
// measures this machine's rates into a machine file (plan/machine.h).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "commands.h"
#include "dtorch/comm/communicator.h"
#include "dtorch/core/atomic_file.h"
#include "dtorch/core/device.h"
#include "dtorch/core/enum_names.h"
#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/freed_memory.h"
#include "dtorch/core/json_config.h"
#include "dtorch/core/log.h"
#include "dtorch/core/machine_load.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/picture.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/parallel/cp/attention.h"
#include "dtorch/plan/cost_model.h"
#include "dtorch/plan/plan_picture.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/train/strategy.h"

namespace dtorch::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = double(1 << 30);

struct PlanFlags {
  std::string model, machine, format = "table", out;
  int nodes = 1, gpus_per_node = 0, nproc_per_node = 0, top = 20;
  int validate = 0, validate_steps = 3;
  std::vector<std::string> strategies;  // only these (train::StrategyKind's names); empty: all
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

// What one layout measured when run: the slowest rank's median step and the largest peak RSS,
// and the share of the machine's CPU time other processes took meanwhile (Note [Others on the
// machine]).
struct Measured {
  bool ran = false;
  double step_s = 0, peak_bytes = 0, others_share = 0;
  std::string why;  // when it did not run
};

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Untimed steps before a layout's timed ones. The cost model predicts a step of a long run, and
// the second step is not one yet: it ran 9% to 24% longer than the later ones in 5 of 6 layouts
// of gpt-small at 2 and 4 ranks on a 2-core machine.
constexpr int kUntimedSteps = 2;

// Runs `dtorch bench memory` with the layout's flags on `world` local ranks of `device` (the
// machine file's: cpu or cuda) for `steps` timed steps after kUntimedSteps, its log kept in
// `log_path`. The peak is the process's resident memory on a CPU, the caching allocator's
// reserve on a GPU.
Measured measure_layout(const std::string& flags, const std::string& device, int world, int steps,
                        const std::string& log_path) {
  std::string command = shell_quoted(paths::executable_path()) + " bench memory --warmup-steps " +
                        std::to_string(kUntimedSteps) + " --device " + shell_quoted(device);
  std::istringstream words(flags);
  for (std::string w; words >> w;)
    command += " " + shell_quoted(w);
  command += " --nproc-per-node " + std::to_string(world) + " --steps " + std::to_string(steps) +
             " 2>" + shell_quoted(log_path);
  Measured m;
  // The layout's processes are this one's children, waited for by pclose (Note [Others on the
  // machine]).
  const MachineLoad load;
  auto job_cpu = [] { return own_cpu_seconds() + children_cpu_seconds(); };
  const double job0 = job_cpu();
  FILE* out = popen(command.c_str(), "r");
  DTORCH_CHECK_T(ConfigError, out != nullptr, "plan --validate cannot start ", command);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, out)) > 0;)
    text.append(buffer, n);
  const int status = pclose(out);
  m.others_share = load.others_share(job_cpu() - job0);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j;
    std::string why;
    if (line.empty() || line[0] != '{' || !json_config::try_parse(line, &j, &why)) continue;
    const char* peak = device == "cpu" ? "peak_rss_bytes" : "cuda_peak_reserved_bytes";
    if (!j.contains("step_seconds_median") || !j.contains(peak)) continue;
    m.step_s = std::max(m.step_s, j["step_seconds_median"].get<double>());
    m.peak_bytes = std::max(m.peak_bytes, j[peak].get<double>());
    m.ran = true;
  }
  if (status != 0 || !m.ran) {
    m.ran = false;
    std::ifstream log(log_path);
    std::string last;
    for (std::string line; std::getline(log, line);)
      if (!line.empty()) last = line;
    m.why = last.empty() ? "exited with status " + std::to_string(status) : last;
  }
  return m;
}

// Predicted against measured, as a signed fraction of the measured.
double miss(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : 0;
}

std::string percent(double fraction) {
  std::ostringstream o;
  o << std::showpos << std::fixed << std::setprecision(0) << 100 * fraction << "%";
  return o.str();
}

int run_plan(const PlanFlags& f) {
  DTORCH_CHECK_T(ConfigError, !f.model.empty(),
                 "dtorch plan needs --model (a name from dtorch train --help)");
  DTORCH_CHECK_T(ConfigError, !f.machine.empty(),
                 "dtorch plan needs --machine FILE: `dtorch plan calibrate --out FILE` measures "
                 "this machine, or write one for another by hand (its fields: docs/plan.md)");
  DTORCH_CHECK_T(ConfigError, (f.gpus_per_node > 0) != (f.nproc_per_node > 0),
                 "give the ranks per node once: --gpus-per-node G or --nproc-per-node P");
  DTORCH_CHECK_T(ConfigError, f.nodes >= 1, "--nodes must be >= 1 (got ", f.nodes, ")");
  DTORCH_CHECK_T(ConfigError, f.top >= 1, "--top must be >= 1 (got ", f.top, ")");
  DTORCH_CHECK_T(ConfigError, f.validate >= 0 && f.validate_steps >= 1,
                 "--validate K takes K >= 0 layouts and --validate-steps 1 or more (got ",
                 f.validate, " and ", f.validate_steps, ")");
  if (!f.out.empty()) {  // the picture never replaces the machine file it is drawn from
    std::error_code ec, out_ec;
    const std::string read = paths::canonical(f.machine, ec);
    DTORCH_CHECK_T(ConfigError, ec || paths::canonical(f.out, out_ec) != read || out_ec, "--out ",
                   f.out, " is the --machine file this plan reads: give the picture a new name");
  }
  std::set<int> stages;  // the ZeRO stages --strategy keeps (empty: all)
  for (const std::string& s : f.strategies) {
    const auto kind = value_named<train::StrategyKind>(s);
    DTORCH_CHECK_T(ConfigError, kind.has_value(), "--strategy ", s, " is not a strategy: give ",
                   listed<train::StrategyKind>(), " (a comma-separated list for several)");
    stages.insert(train::zero_stage(*kind));
  }
  plan::Machine m = plan::read_machine(f.machine);
  const int per_node = f.gpus_per_node > 0 ? f.gpus_per_node : f.nproc_per_node;
  m.ranks_per_node = per_node;
  if (f.memory_per_rank_gib > 0) m.memory_per_rank_bytes = f.memory_per_rank_gib * kGiB;
  const int world = f.nodes * per_node;
  const plan::Workload w = plan::workload_of(f.model, f.seq_len, f.global_batch);
  std::vector<plan::Prediction> ranked = plan::rank_layouts(w, m, world);
  if (!stages.empty())
    ranked.erase(
        std::remove_if(ranked.begin(), ranked.end(),
                       [&](const plan::Prediction& p) { return !stages.count(p.layout.zero); }),
        ranked.end());
  DTORCH_CHECK_T(ConfigError, !ranked.empty(), "no layout of ", world, " ranks runs ", f.model,
                 " at a global batch of ", f.global_batch,
                 stages.empty() ? "" : " under the --strategy given",
                 ": use a --global-batch-size that the data-parallel degrees divide",
                 stages.empty() ? "" : ", or another --strategy");
  const int shown = std::min<int>(f.top, static_cast<int>(ranked.size()));
  // --validate K: the first K layouts that fit, run here.
  std::vector<Measured> measured(ranked.size());
  int validated = 0;
  if (f.validate > 0) {
    DTORCH_CHECK_T(ConfigError, f.nodes == 1,
                   "plan --validate runs the layouts on this machine: give --nodes 1 (got ",
                   f.nodes, ")");
    std::error_code ec;
    const std::string logs = paths::make_temp_directory("dtorch-plan-validate", ec);
    DTORCH_CHECK_T(ConfigError, !ec, "plan --validate cannot make a folder for its runs' logs (",
                   ec.message(), "): set TMPDIR to a writable folder");
    for (size_t i = 0; i < ranked.size() && validated < f.validate; ++i) {
      if (!ranked[i].fits) continue;
      ++validated;
      const std::string flags = plan::flags_of(ranked[i].layout, w);
      log::info("validating ", validated, "/", f.validate, " (layout #", i + 1, "): ", flags);
      measured[i] = measure_layout(flags, m.device, world, f.validate_steps,
                                   logs + "/layout-" + std::to_string(i + 1) + ".log");
      if (!measured[i].ran) log::warn("layout #", i + 1, " did not run: ", measured[i].why);
      if (measured[i].ran && noticeable(measured[i].others_share))
        log::warn(others_took(measured[i].others_share, str("layout #", i + 1, " ran")),
                  "; its measured step includes them (validate on an otherwise idle machine)");
    }
    paths::remove_all(logs);
  }
  if (!f.out.empty()) {
    const int drawn = std::max(shown, validated);
    std::vector<double> steps;
    for (int i = 0; i < drawn; ++i)
      steps.push_back(measured[i].ran ? measured[i].step_s : 0);
    write_picture(plan::plan_picture({ranked.begin(), ranked.begin() + drawn},
                                     validated > 0 ? steps : std::vector<double>{}, w,
                                     str(f.model, " on ", world, " rank(s), global batch ",
                                         w.global_batch, ": predicted step time")),
                  f.out);
  }
  if (f.format == "json") {
    for (int i = 0; i < std::max(shown, validated); ++i) {
      const plan::Prediction& p = ranked[i];
      nlohmann::json j{{"rank", i + 1},
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
                       {"predicted_transient_gib", p.transient_bytes / kGiB},
                       {"fits", p.fits}};
      if (measured[i].ran) {
        j["measured_step_s"] = measured[i].step_s;
        j["measured_peak_gib"] = measured[i].peak_bytes / kGiB;
        j["measured_others_cpu_share"] = measured[i].others_share;
      } else if (!measured[i].why.empty()) {
        j["not_run"] = measured[i].why;
      }
      std::cout << j.dump() << "\n";
    }
    return 0;
  }
  int fitting = 0;
  for (const auto& p : ranked)
    fitting += p.fits;
  std::cout << f.model << ", "
            << (w.measured() ? "1 x 28 x 28 images" : std::to_string(w.seq_len) + " tokens")
            << ", global batch " << w.global_batch << ", on " << world << " rank(s) (" << f.nodes
            << " node(s) x " << per_node << ") of machine '" << m.name << "' ("
            << gib(m.memory_per_rank_bytes) << " GiB per rank): " << ranked.size() << " layouts, "
            << fitting << " fit\n";
  std::cout << std::setw(4) << "#" << std::setw(10) << "step s" << std::setw(10) << "compute"
            << std::setw(10) << "comm" << std::setw(10) << "bubble" << std::setw(11) << "peak GiB";
  if (validated > 0) std::cout << std::setw(17) << "measured s" << std::setw(19) << "measured GiB";
  std::cout << "  flags\n";
  for (int i = 0; i < std::max(shown, validated); ++i) {
    const plan::Prediction& p = ranked[i];
    std::cout << std::setw(4) << i + 1 << std::setw(10) << seconds(p.step_s()) << std::setw(10)
              << seconds(p.compute_s) << std::setw(10) << seconds(p.exposed_comm_s) << std::setw(10)
              << seconds(p.bubble_s) << std::setw(11) << gib(p.peak_bytes);
    if (validated > 0) {
      const Measured& got = measured[i];
      std::cout << std::setw(17)
                << (got.ran
                        ? seconds(got.step_s) + " (" + percent(miss(p.step_s(), got.step_s)) + ")"
                        : std::string("-"))
                << std::setw(19)
                << (got.ran ? gib(got.peak_bytes) + " (" +
                                  percent(miss(p.peak_bytes, got.peak_bytes)) + ")"
                            : std::string("-"));
    }
    std::cout << "  " << plan::flags_of(p.layout, w)
              << (p.fits ? ""
                         : "  (does not fit: over by " +
                               gib(p.peak_bytes - m.memory_per_rank_bytes) + " GiB)")
              << "\n";
  }
  if (validated > 0) {
    // How good the predictions were: each layout's misses, and whether the predicted best is
    // the measured best.
    int ran = 0, time_ok = 0, memory_ok = 0, best = -1, first = -1;
    for (size_t i = 0; i < ranked.size(); ++i) {
      if (!measured[i].ran) continue;
      ++ran;
      time_ok += std::abs(miss(ranked[i].step_s(), measured[i].step_s)) <= 0.25;
      memory_ok += std::abs(miss(ranked[i].peak_bytes, measured[i].peak_bytes)) <= 0.15;
      if (first < 0) first = static_cast<int>(i);
      if (best < 0 || measured[i].step_s < measured[best].step_s) best = static_cast<int>(i);
    }
    std::cout << "validated " << ran << " of " << validated
              << " layout(s): step time within 25% for " << time_ok
              << ", peak memory within 15% for " << memory_ok;
    if (ran > 0) {
      std::cout << "; the predicted best (#" << first + 1 << ") measured "
                << seconds(measured[first].step_s) << " s, the measured best (#" << best + 1 << ") "
                << seconds(measured[best].step_s) << " s ("
                << percent(miss(measured[first].step_s, measured[best].step_s)) << ")";
    }
    std::cout << "\n";
  }
  return 0;
}

// --- calibrate -------------------------------------------------------------------------

struct CalibrateFlags {
  std::string out;
  int nproc_per_node = 2;
  DeviceKind device = DeviceKind::Auto;
};

// Where calibration runs: each rank's device (its GPU, or the CPU), and the sizes it measures
// there (a GPU needs larger products and buffers to reach its rates).
struct Bench {
  at::Device device = at::kCPU;
  int64_t square = 512;  // the matmul_flops product's side
  int64_t width = 1024;  // the linear layer's weight side
  std::vector<int64_t> rows = {16, 64, 256, 1024, 4096};
  // The convolution rate's layer: a 3x3 convolution of conv_channels to as many, padding 1, over
  // conv_batch images of conv_side (a ResNet stage's).
  int64_t conv_batch = 4, conv_channels = 64, conv_side = 28;
  int64_t large_floats = int64_t(4) << 20;  // a collective's large buffer per rank
  // Ring attention's layer: heads of head_dim, at two sizes of the rank's tokens.
  int64_t ring_heads = 12, ring_head_dim = 64;
  std::vector<int64_t> ring_tokens = {32, 128};
  int64_t lockstep_rows = 64;  // a segment's rows: a layer's work at a small micro-batch
  torch::TensorOptions options() const { return torch::TensorOptions().device(device); }
};

Bench bench_for(at::Device d) {
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
  return b;
}

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

// How many calls of f take about `budget` seconds (`least` at least), from one timed call after
// a warm-up: the same count on every rank, so every rank runs as many (f may be a collective).
int calls_for(comm::Communicator& group, const Bench& b, double budget, int least,
              const std::function<void()>& f) {
  f();  // warm-up
  const double one = time_calls(group, b, 1, f);
  return static_cast<int>(std::clamp(budget / std::max(one, 1e-7), double(least), 1e5));
}

// Seconds per call of f over about `budget` seconds (`least` calls at least).
double time_per_call(comm::Communicator& group, const Bench& b, double budget,
                     const std::function<void()>& f, int least = 3) {
  const int calls = calls_for(group, b, budget, least, f);
  return time_calls(group, b, calls, f) / calls;
}

// Calibrate measures every rate this many times and keeps each one's median.
constexpr int kRounds = 3;

// The median of get(round) over the rounds.
template <class T, class Get>
double median_of(const std::vector<T>& rounds, Get get) {
  std::vector<double> v;
  for (const T& r : rounds)
    v.push_back(get(r));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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

// Seconds per byte that a fresh allocation costs beyond writing it: 64 MiB allocated and filled
// each call, against the same bytes filled in place (about 0 on a GPU, whose caching allocator
// keeps its blocks).
double first_touch_seconds_per_byte(comm::Communicator& world, const Bench& b) {
  const int64_t floats = int64_t(16) << 20;
  torch::Tensor kept = torch::empty({floats}, b.options());
  const double reused = time_per_call(world, b, 0.5, [&] { kept.fill_(1); });
  const double fresh =
      time_per_call(world, b, 0.5, [&] { torch::empty({floats}, b.options()).fill_(1); });
  return std::max(0.0, fresh - reused) / (4.0 * floats);
}

// The rates every rank measures alone, at once (they share the node, as in training).
struct ComputeRates {
  std::map<std::string, double> flops, conv;
  std::map<std::string, std::vector<plan::RowsRate>> by_rows;
  double first_touch = 0, adamw = 0;
};

// One round of the rates. The first (`first` null) measures fp32 and bf16, the matmul by rows
// while a call takes under a quarter second (bf16 on a CPU is slow), and the convolution; fp32
// alone where this LibTorch has no bf16 matmul or convolution on the device. The later ones
// measure what the first did.
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
  torch::optim::AdamW adamw({w}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  r.adamw = time_per_call(world, bench, 1.0, [&] { adamw.step(); }) / double(w.numel());
  return r;
}

// A causal ring attention layer's seconds over the group of 2 `pair`, every pair of the node's
// ranks running at once: forward and backward at each of the bench's sizes (`both`, in
// ring_tokens' order), and forward alone at the first (the forward's share).
struct RingSeconds {
  std::vector<double> both;
  double forward = 0;
};
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

// Ring attention's own work (plan::RingAttentionCost): what a layer took beyond the cost
// model's charge for its FLOPs and messages (m's rates); the time per score from the two sizes'
// difference, the time per step from the rest at the smaller size.
plan::RingAttentionCost ring_attention_cost(const RingSeconds& measured, const Bench& b,
                                            const plan::Machine& m) {
  std::vector<double> rest, scores;
  for (size_t k = 0; k < b.ring_tokens.size(); ++k) {
    const plan::AttentionShape layer{1, b.ring_heads, b.ring_tokens[k], b.ring_head_dim, 2, 4};
    const plan::RingAttentionTime charged = plan::ring_attention_time(m, layer, false, false);
    rest.push_back(std::max(0.0, measured.both[k] - charged.attention_s - charged.exposed_s));
    scores.push_back(plan::attention_scores(layer));
  }
  plan::RingAttentionCost c;
  c.seconds_per_score = std::max(0.0, (rest[1] - rest[0]) / (scores[1] - scores[0]));
  c.step_seconds = std::max(0.0, rest[0] - c.seconds_per_score * scores[0]) / 2;
  c.forward_share = std::clamp(measured.forward / measured.both[0], 0.0, 1.0);
  return c;
}

// How much longer compute takes when ranks meet after every segment of it (a layer under tensor
// or context parallelism) than when they run apart (Machine::lockstep_fraction): 40 segments of a
// linear layer's three products at the bench's rows, with and without a one-float all-reduce
// over `pair` after each (a rank of no pair computes alongside, never meeting). Every rank of the
// job runs the same mode at once, as a job's tensor-parallel groups do (timed by pairs, one
// pair's meetings overlapped another's work apart). The wait comes and goes with how the ranks
// happen to share the cores: at 4 ranks on 2 cores one timing each way read from -0.14 to
// +0.43, and one of each a round gave 0 to 0.29 over six rounds, so the fraction is the median
// of kLockstepTrials timings each way, taken in turn. The all-reduces' own time (microseconds
// each, against milliseconds a segment) counts in the wait.
constexpr int kLockstepTrials = 7;
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
  for (int i = 0; i < kLockstepTrials; ++i) {
    const double apart = time_calls(world, b, calls, [&] { segments(false); });
    const double together = time_calls(world, b, calls, [&] { segments(true); });
    fractions.push_back(together / apart - 1);
  }
  return std::max(0.0, median_of(fractions, [](double f) { return f; }));
}

plan::LinkCost measure(comm::Communicator& group, const Bench& b, plan::Collective op) {
  const int n = group.size();
  auto run = [&](int64_t floats) {
    torch::Tensor full = torch::ones({floats}, b.options());
    torch::Tensor part = torch::ones({floats / n}, b.options());
    switch (op) {
      case plan::Collective::AllReduce:
        return time_per_call(group, b, 0.5,
                             [&] { group.allreduce(full, comm::ReduceOp::Sum, "c"); });
      case plan::Collective::ReduceScatter:  // `full` is scratch: its values do not matter
        return time_per_call(group, b, 0.5,
                             [&] { group.reduce_scatter(full, part, comm::ReduceOp::Sum, "c"); });
      case plan::Collective::AllGather:
        return time_per_call(group, b, 0.5, [&] { group.allgather_into(full, part, "c"); });
      case plan::Collective::P2P:
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
  plan::LinkCost l;
  l.ranks = n;
  l.latency_s = t_small / plan::ring_steps(op, n);
  l.bus_bytes_per_s =
      plan::bus_bytes(op, n, 4.0 * (large - small)) / std::max(1e-9, t_large - t_small);
  return l;
}

// One round of every rate calibrate measures, as this rank saw it (a rank outside a group or
// the ring's pairs leaves its part empty).
struct Round {
  ComputeRates rates;
  std::map<plan::Collective, std::vector<plan::LinkCost>> intra, inter;
  RingSeconds ring;
  double lockstep = 0;
};

// Each rate's median over the rounds into `m`; ring attention's and the lockstep's where
// `paired` (this rank ran the ring, and the ranks shared a node, so every rank timed the
// lockstep: rank 0's pair is the one whose point-to-point link was measured).
void set_medians(plan::Machine& m, const std::vector<Round>& rounds, const Bench& bench,
                 bool paired) {
  auto of = [&](auto get) { return median_of(rounds, get); };
  for (const auto& [name, rates] : rounds.front().rates.by_rows) {
    m.matmul_flops[name] = of([&](const Round& r) { return r.rates.flops.at(name); });
    m.conv_flops[name] = of([&](const Round& r) { return r.rates.conv.at(name); });
    for (size_t i = 0; i < rates.size(); ++i)
      m.matmul_by_rows[name].push_back(
          {rates[i].rows, of([&](const Round& r) { return r.rates.by_rows.at(name)[i].flops; })});
  }
  m.first_touch_seconds_per_byte = of([](const Round& r) { return r.rates.first_touch; });
  m.adamw_seconds_per_parameter = of([](const Round& r) { return r.rates.adamw; });
  for (auto [links, into] :
       {std::pair{&Round::intra, &m.intra_node}, {&Round::inter, &m.inter_node}})
    for (const auto& [op, costs] : rounds.front().*links)
      for (size_t k = 0; k < costs.size(); ++k) {
        plan::LinkCost l = costs[k];
        l.latency_s = of([&](const Round& r) { return (r.*links).at(op)[k].latency_s; });
        l.bus_bytes_per_s =
            of([&](const Round& r) { return (r.*links).at(op)[k].bus_bytes_per_s; });
        (*into)[op].push_back(l);
      }
  if (!paired) return;
  RingSeconds ring;
  for (size_t k = 0; k < bench.ring_tokens.size(); ++k)
    ring.both.push_back(of([&](const Round& r) { return r.ring.both[k]; }));
  ring.forward = of([](const Round& r) { return r.ring.forward; });
  m.ring_attention = ring_attention_cost(ring, bench, m);
  m.lockstep_fraction = of([](const Round& r) { return r.lockstep; });
}

// The job's ranks by node (the launcher's node_rank), each node's in rank order, rank 0's node
// first. A machine file has one ranks_per_node: every node must run as many ranks.
std::vector<std::vector<int>> ranks_by_node(const comm::Communicator& world) {
  std::vector<std::vector<int>> nodes;
  std::map<int, size_t> index;  // node_rank -> its place in nodes
  for (int r = 0; r < world.size(); ++r) {
    auto [at, added] = index.emplace(world.node_of(r), nodes.size());
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

// A machine file is never written over: checked where the workers start and by every rank
// before it measures (a job started by torchrun or srun skips the first place).
void refuse_existing(const std::string& out) {
  DTORCH_CHECK_T(ConfigError, !paths::exists(out), "plan calibrate: --out ", out,
                 " exists; give a new path (a machine file is never overwritten)");
}

int calibrate_worker(const CalibrateFlags& f) {
  refuse_existing(f.out);
  const double base = double(report::process_memory().rss);
  // Training keeps freed memory for the next step (Note [Returning released memory]); so do the
  // measurements, or an AdamW step would pay for page faults a training step does not.
  set_freed_memory(FreedMemory::Reuse);
  auto world = comm::Communicator::from_env();
  const int W = world->size();
  DTORCH_CHECK_T(ConfigError, W >= 2,
                 "plan calibrate measures collectives between ranks: give --nproc-per-node 2 or "
                 "more");
  const Bench bench = bench_for(train::resolve_run_device(f.device, world->info()));
  const bool gpu = bench.device.is_cuda();
  const auto t0 = Clock::now();
  plan::Machine m;
  m.device = gpu ? "cuda" : "cpu";
  const std::vector<std::vector<int>> nodes = ranks_by_node(*world);
  const int per_node = static_cast<int>(nodes.front().size());
  m.name = launch::short_hostname() + " (" + (gpu ? gpu_name(bench.device) : "cpu") + ", " +
           (nodes.size() > 1 ? std::to_string(nodes.size()) + " nodes x " : "") +
           std::to_string(per_node) + " ranks)";
  m.ranks_per_node = per_node;
  if (gpu) {  // the caching allocator's reserve is what a rank's GPU memory holds
    m.memory_per_rank_bytes = double(device_memory(bench.device).total);
  } else {
    m.base_bytes_per_rank = base;
    const report::ProcessMemory mem = report::process_memory();
    double total = double(mem.total);
    if (mem.cgroup_limit > 0) total = std::min(total, double(mem.cgroup_limit));
    m.memory_per_rank_bytes = total / per_node;
  }
  // The groups the collectives are measured over, made once: within rank 0's node groups of 2,
  // 4, ... and all its ranks, each its first ranks (the whole job's group where that is all of
  // them); across nodes, the same over a list taking one rank of each node in turn (as a
  // data-parallel group strides across the nodes under tensor parallelism). Null where this
  // rank is not a member.
  using Groups = std::vector<std::pair<int, std::shared_ptr<comm::Communicator>>>;
  auto groups_over = [&](const std::vector<int>& order, const std::string& name) {
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
        group = s == W ? world : world->split(members, name + std::to_string(s));
      out.emplace_back(s, group);
      world->barrier("calibration groups");
    }
    return out;
  };
  const Groups intra = groups_over(nodes.front(), "calibrate-intra");
  Groups inter;
  if (nodes.size() > 1) {
    std::vector<int> across;
    for (int i = 0; i < per_node; ++i)
      for (const auto& node : nodes)
        across.push_back(node[i]);
    inter = groups_over(across, "calibrate-inter");
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
  // Every rate, kRounds times over, one round after the other: a spell of the machine that
  // slows one round moves no median.
  std::vector<Round> rounds(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    Round& r = rounds[i];
    const std::string round =
        "(round " + std::to_string(i + 1) + " of " + std::to_string(kRounds) + ")";
    if (world->rank() == 0)
      log::info("calibrating on ", bench.device.str(), " ", round,
                ": matmul and convolution rates (fp32, bf16), freshly allocated memory and an "
                "AdamW step on every rank");
    r.rates = compute_rates(*world, bench, i == 0 ? nullptr : &rounds.front().rates);
    auto measure_groups = [&](const Groups& groups, const std::string& where,
                              std::map<plan::Collective, std::vector<plan::LinkCost>>& into) {
      for (const auto& [size, group] : groups) {
        if (world->rank() == 0)
          log::info("calibrating ", round, ": collectives over ", size, " ranks ", where);
        if (group) {
          for (plan::Collective op : {plan::Collective::AllReduce, plan::Collective::ReduceScatter,
                                      plan::Collective::AllGather})
            into[op].push_back(measure(*group, bench, op));
          if (size == 2)
            into[plan::Collective::P2P].push_back(measure(*group, bench, plan::Collective::P2P));
        }
        world->barrier("calibration");
      }
    };
    measure_groups(intra, "within a node", r.intra);
    measure_groups(inter, "across nodes", r.inter);
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
  if (world->rank() == 0) {
    const double others = load.others_share(node_cpu.item<double>());
    if (noticeable(others))
      log::warn(others_took(others, "calibrating"),
                "; every rate includes them (calibrate on an otherwise idle machine)");
    set_medians(m, rounds, bench, pair != nullptr);
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
  cmd->add_option("--model", f->model, "the model, as dtorch train names it");
  cmd->add_option("--machine", f->machine, "machine file (dtorch plan calibrate writes one)");
  cmd->add_option("--nodes", f->nodes)->capture_default_str();
  cmd->add_option("--gpus-per-node", f->gpus_per_node, "ranks per node");
  cmd->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node, "ranks per node");
  cmd->add_option("--global-batch-size", f->global_batch, "samples per optimizer step");
  cmd->add_option("--seq-len", f->seq_len,
                  "a gpt-* model's tokens per sequence (default: its block size)");
  cmd->add_option("--memory-per-rank", f->memory_per_rank_gib,
                  "GiB per rank (default: the machine file's)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            const double gib = std::strtod(s.c_str(), nullptr);
            return std::isfinite(gib) && gib > 0
                       ? ""
                       : "GiB per rank must be a finite number above 0 (got " + s +
                             "); leave it out for the machine file's";
          },
          "GIB>0"));
  cmd->add_option("--format", f->format)
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->add_option("--top", f->top, "layouts shown")->capture_default_str();
  cmd->add_option("--strategy", f->strategies,
                  "only layouts of these strategies (ddp, zero1, zero2, zero3; comma-separated)")
      ->delimiter(',');
  cmd->add_option("--out", f->out,
                  "also draw the layouts shown (their predicted time split) into this .png or "
                  ".svg file");
  cmd->add_option("--validate", f->validate,
                  "run the first K layouts that fit here (dtorch bench memory) and print "
                  "predicted against measured step time and peak memory");
  cmd->add_option("--validate-steps", f->validate_steps,
                  str("timed steps per layout, after ", kUntimedSteps,
                      " untimed; their median is the measured step"))
      ->capture_default_str();

  auto c = std::make_shared<CalibrateFlags>();
  auto* cal = cmd->add_subcommand("calibrate",
                                  "Measure this machine's matmul rates and collectives into a "
                                  "machine file for dtorch plan --machine");
  cal->add_option("--out", c->out, "the machine file to write (must not exist)")->required();
  cal->add_option("--nproc-per-node,--nproc_per_node", c->nproc_per_node)->capture_default_str();
  add_choice_option(cal, "--device", c->device,
                    "cpu | cuda (one GPU per rank) | auto (the GPUs where there are)");
  cal->callback([c, &exit_code] {
    DTORCH_CHECK_T(ConfigError, c->nproc_per_node >= 2, "plan calibrate: --nproc-per-node ",
                   c->nproc_per_node, " must be 2 or more (it measures collectives)");
    if (env::get("RANK")) {  // a worker (or a rank of a job started by a launcher)
      exit_code = calibrate_worker(*c);
      return;
    }
    refuse_existing(c->out);
    resolve_device(c->device, 0, c->nproc_per_node);  // GPUs asked for are there, one per rank
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
