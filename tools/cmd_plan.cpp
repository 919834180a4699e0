// `dtorch plan`: every layout of a job ranked by its predicted step time, with its predicted
// peak memory per rank and the flags that run it (Note [Cost model]); `dtorch plan calibrate`
// measures this machine's rates into a machine file (plan/machine.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
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
#include "dtorch/launch/store.h"
#include "dtorch/plan/calibrate.h"
#include "dtorch/plan/cost_model.h"
#include "dtorch/plan/plan_picture.h"
#include "dtorch/report/out_of_memory.h"
#include "dtorch/train/strategy/strategy.h"

namespace dtorch::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = double(1 << 30);

struct PlanFlags {
  std::string model, machine, format = "table", out, offload = "auto";
  int nodes = 1, gpus_per_node = 0, nproc_per_node = 0, top = 20;
  int validate = 0, validate_steps = 3;
  std::vector<std::string> strategies;  // only these (train::StrategyKind's names); empty: all
  int dp_replicate = -1;                // only layouts of this many replicas; -1: all
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

// Runs `dtorch bench memory` with the layout's flags on `nodes` x `per_node` ranks of `device`
// (the machine file's: cpu or cuda) for `steps` timed steps after kUntimedSteps, the logs kept in
// `log_path` (a node's in log_path.nodeN). The peak is the process's resident memory on a CPU,
// the caching allocator's reserve on a GPU. Several nodes run as that many launchers on
// 127.0.0.1, every node's ranks on this machine: the nodes meet over TCP, as a machine file
// calibrated with `dtorch launch --nnodes` on one host measured them.
Measured measure_layout(const std::string& flags, const std::string& device, int nodes,
                        int per_node, int steps, const std::string& log_path) {
  const std::string self = shell_quoted(paths::executable_path());
  std::string bench = self + " bench memory --warmup-steps " + std::to_string(kUntimedSteps) +
                      " --device " + shell_quoted(device);
  std::istringstream words(flags);
  for (std::string w; words >> w;)
    bench += " " + shell_quoted(w);
  bench += " --steps " + std::to_string(steps);
  std::vector<std::string> commands, logs;
  if (nodes == 1) {
    logs.push_back(log_path);
    commands.push_back(bench + " --nproc-per-node " + std::to_string(per_node));
  } else {
    const std::string port = std::to_string(launch::free_port());
    for (int node = 0; node < nodes; ++node) {
      logs.push_back(log_path + ".node" + std::to_string(node));
      commands.push_back(self + " launch --nnodes " + std::to_string(nodes) + " --node-rank " +
                         std::to_string(node) + " --nproc-per-node " + std::to_string(per_node) +
                         " --master-addr 127.0.0.1 --master-port " + port + " -- " + bench);
    }
  }
  Measured m;
  // The layout's processes are this one's children, waited for by pclose (Note [Others on the
  // machine]).
  const MachineLoad load;
  auto job_cpu = [] { return own_cpu_seconds() + children_cpu_seconds(); };
  const double job0 = job_cpu();
  std::vector<FILE*> outs;
  for (size_t i = 0; i < commands.size(); ++i) {
    const std::string command = commands[i] + " 2>" + shell_quoted(logs[i]);
    outs.push_back(popen(command.c_str(), "r"));
    DTORCH_CHECK_T(ConfigError, outs.back() != nullptr, "plan --validate cannot start ", command);
  }
  // A line a rank prints per node, so that reading the nodes in turn never fills a pipe.
  std::string text;
  int failed = -1, status = 0;  // the first node that failed, and its wait status
  for (size_t i = 0; i < outs.size(); ++i) {
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof buffer, outs[i])) > 0;)
      text.append(buffer, n);
    const int s = pclose(outs[i]);
    if (s != 0 && failed < 0) {
      failed = static_cast<int>(i);
      status = s;
    }
  }
  m.others_share = load.others_share(job_cpu() - job0);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j;
    std::string why;
    const size_t brace = line.find('{');  // after a launcher's "[n0 r0] " on several nodes
    if (brace == std::string::npos || !json_config::try_parse(line.substr(brace), &j, &why))
      continue;
    const char* peak = device == "cpu" ? "peak_rss_bytes" : "cuda_peak_reserved_bytes";
    if (!j.contains("step_seconds_median") || !j.contains(peak)) continue;
    m.step_s = std::max(m.step_s, j["step_seconds_median"].get<double>());
    m.peak_bytes = std::max(m.peak_bytes, j[peak].get<double>());
    m.ran = true;
  }
  if (failed >= 0 || !m.ran) {
    m.ran = false;
    std::ifstream log(logs[std::max(failed, 0)]);
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
  DTORCH_CHECK_T(ConfigError, f.dp_replicate == -1 || f.dp_replicate >= 1,
                 "--dp-replicate must be >= 1 (got ", f.dp_replicate,
                 "): 1 keeps the layouts with one replica, leave it out for all");
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
  const plan::OffloadLayouts offload = f.offload == "none"   ? plan::OffloadLayouts::None
                                       : f.offload == "nvme" ? plan::OffloadLayouts::Only
                                                             : plan::OffloadLayouts::WhereNeeded;
  std::vector<plan::Prediction> ranked = plan::rank_layouts(w, m, world, offload);
  auto flags_of = [&](const plan::Layout& l) { return plan::flags_of(l, w, m.offload_disk.dir); };
  const bool filtered = !stages.empty() || f.dp_replicate >= 1;
  ranked.erase(
      std::remove_if(ranked.begin(), ranked.end(),
                     [&](const plan::Prediction& p) {
                       return (!stages.empty() && !stages.count(p.layout.zero)) ||
                              (f.dp_replicate >= 1 && p.layout.dp_replicate != f.dp_replicate);
                     }),
      ranked.end());
  DTORCH_CHECK_T(ConfigError, !ranked.empty(), "no layout of ", world, " ranks runs ", f.model,
                 " at a global batch of ", f.global_batch,
                 filtered ? " under the --strategy or --dp-replicate given" : "",
                 ": use a --global-batch-size that the data-parallel degrees divide",
                 filtered ? ", or another --strategy or --dp-replicate (replicas are one a node "
                            "of several)"
                          : "");
  const int shown = std::min<int>(f.top, static_cast<int>(ranked.size()));
  // --validate K: the first K layouts that fit, run here.
  std::vector<Measured> measured(ranked.size());
  int validated = 0;
  if (f.validate > 0) {
    // Several nodes run here as that many launchers (measure_layout): a GPU each rank needs
    // its own of would be shared by the nodes' local ranks.
    DTORCH_CHECK_T(ConfigError, f.nodes == 1 || m.device == "cpu", "plan --validate runs every ",
                   "node's ranks on this machine, and machine '", m.name,
                   "' computes on GPUs, one a rank: validate with --nodes 1 (got --nodes ", f.nodes,
                   ")");
    std::error_code ec;
    const std::string logs = paths::make_temp_directory("dtorch-plan-validate", ec);
    DTORCH_CHECK_T(ConfigError, !ec, "plan --validate cannot make a folder for its runs' logs (",
                   ec.message(), "): set TMPDIR to a writable folder");
    for (size_t i = 0; i < ranked.size() && validated < f.validate; ++i) {
      if (!ranked[i].fits) continue;
      ++validated;
      const std::string flags = flags_of(ranked[i].layout);
      log::info("validating ", validated, "/", f.validate, " (layout #", i + 1, "): ", flags);
      measured[i] = measure_layout(flags, m.device, f.nodes, per_node, f.validate_steps,
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
                       {"flags", flags_of(p.layout)},
                       {"dp", p.layout.dp},
                       {"tp", p.layout.tp},
                       {"pp", p.layout.pp},
                       {"cp", p.layout.cp},
                       {"dp_replicate", p.layout.dp_replicate},
                       {"predicted_step_s", p.step_s()},
                       {"predicted_compute_s", p.compute_s},
                       {"predicted_exposed_comm_s", p.exposed_comm_s},
                       {"predicted_bubble_s", p.bubble_s},
                       {"predicted_offload_s", p.offload_s},
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
  // The disk's column where a layout shown keeps the optimizer's state there.
  bool disk = false;
  for (int i = 0; i < std::max(shown, validated); ++i)
    disk = disk || ranked[i].layout.offload;
  std::cout << std::setw(4) << "#" << std::setw(10) << "step s" << std::setw(10) << "compute"
            << std::setw(10) << "comm" << std::setw(10) << "bubble";
  if (disk) std::cout << std::setw(10) << "disk";
  std::cout << std::setw(11) << "peak GiB";
  if (validated > 0) std::cout << std::setw(17) << "measured s" << std::setw(19) << "measured GiB";
  std::cout << "  flags\n";
  for (int i = 0; i < std::max(shown, validated); ++i) {
    const plan::Prediction& p = ranked[i];
    std::cout << std::setw(4) << i + 1 << std::setw(10) << seconds(p.step_s()) << std::setw(10)
              << seconds(p.compute_s) << std::setw(10) << seconds(p.exposed_comm_s) << std::setw(10)
              << seconds(p.bubble_s);
    if (disk) std::cout << std::setw(10) << seconds(p.offload_s);
    std::cout << std::setw(11) << gib(p.peak_bytes);
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
    std::cout << "  " << flags_of(p.layout)
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
  std::string offload_dir;  ///< where to measure the disk --offload-optimizer nvme would use
  int nproc_per_node = 2;
  DeviceKind device = DeviceKind::Auto;
  bool quick = false;  ///< plan::bench_for's tiny sizes, one round, a tenth of the time
};

// A machine file is never written over: checked where the workers start and by every rank
// before it measures (a job started by torchrun or srun skips the first place).
void refuse_existing(const std::string& out) {
  DTORCH_CHECK_T(ConfigError, !paths::exists(out), "plan calibrate: --out ", out,
                 " exists; give a new path (a machine file is never overwritten)");
}

// --offload-dir as the layouts' flags will name it: its absolute path. ConfigError when it is not
// a folder.
std::string offload_folder(const std::string& dir) {
  std::error_code ec;
  const std::string path = paths::canonical(dir, ec);
  DTORCH_CHECK_T(ConfigError, !ec && paths::is_directory(path), "plan calibrate: --offload-dir ",
                 dir, " is not a folder: create it on the disk the runs would use");
  return path;
}

int calibrate_worker(const CalibrateFlags& f) {
  refuse_existing(f.out);
  const double base = double(report::process_memory().rss);
  // Training keeps freed memory for the next step (Note [Returning released memory]); so do the
  // measurements, or an AdamW step would pay for page faults a training step does not.
  set_freed_memory(FreedMemory::Reuse);
  auto world = comm::Communicator::from_env();
  const auto t0 = Clock::now();
  plan::Bench bench = plan::bench_for(train::resolve_run_device(f.device, world->info()), f.quick);
  if (!f.offload_dir.empty()) bench.offload_dir = offload_folder(f.offload_dir);
  if (const std::optional<plan::Machine> m = plan::calibrate(world, bench, base)) {
    const std::string json = plan::machine_json(*m);
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
  cmd->add_option("--dp-replicate", f->dp_replicate,
                  "only layouts of this many replicas (1: ZeRO over every data-parallel rank; "
                  "a hybrid layout has one a node)");
  cmd->add_option("--out", f->out,
                  "also draw the layouts shown (their predicted time split) into this .png or "
                  ".svg file");
  cmd->add_option("--offload-optimizer", f->offload,
                  "auto: also a ZeRO layout with the optimizer's state on disk where the layout "
                  "does not fit in memory | none | nvme: only such layouts (the machine file needs "
                  "the disk's rates: plan calibrate --offload-dir)")
      ->check(CLI::IsMember({"auto", "none", "nvme"}))
      ->capture_default_str();
  cmd->add_option("--validate", f->validate,
                  "run the first K layouts that fit here (dtorch bench memory; --nodes N as N "
                  "launchers on 127.0.0.1) and print predicted against measured step time and "
                  "peak memory");
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
  cal->add_option("--offload-dir", c->offload_dir,
                  "also measure this folder's disk, written and read as --offload-optimizer nvme "
                  "does, so that plan proposes layouts with the optimizer's state there");
  cal->add_flag("--quick", c->quick,
                "tiny sizes, one round, a tenth of the time: a rough file in seconds, to try the "
                "command or test with, not to plan a job from");
  cal->callback([c, &exit_code] {
    DTORCH_CHECK_T(ConfigError, c->nproc_per_node >= 2, "plan calibrate: --nproc-per-node ",
                   c->nproc_per_node, " must be 2 or more (it measures collectives)");
    if (env::get("RANK")) {  // a worker (or a rank of a job started by a launcher)
      exit_code = calibrate_worker(*c);
      return;
    }
    refuse_existing(c->out);
    if (!c->offload_dir.empty()) offload_folder(c->offload_dir);
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
