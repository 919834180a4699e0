// `dtorch launch [flags] -- PROGRAM [ARGS...]`: torchrun's flags (both spellings) mapped onto
// launch::LaunchOptions, so job scripts written for torchrun switch by changing one word.
#include <torch/cuda.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/launch/job_nodes.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/launch/rdzv_options.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {

// The flag values that need more than a plain number before they become LaunchOptions.
struct LaunchFlags {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  std::vector<std::string> command;  // filled only when the program comes after "--"
};

int parse_int(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  int x = 0;
  try {
    x = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DTORCH_CHECK_T(ConfigError, used == v.size() && !v.empty(), flag, "=", v,
                 " is not a whole number");
  return x;
}

// torchrun's --nproc-per-node also takes "cpu"/"auto" (one worker per core) and "gpu".
int parse_nproc(const std::string& v) {
  if (v == "cpu" || v == "auto") {
    if (v == "auto" && torch::cuda::is_available()) return torch::cuda::device_count();
    return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  }
  if (v == "gpu") {
    int n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    DTORCH_CHECK_T(ConfigError, n > 0, "--nproc-per-node=gpu but this LibTorch sees no CUDA ",
                   "device; give a number, or use cpu");
    return n;
  }
  return parse_int("--nproc-per-node", v);
}

// See the note in add_launch_command: the program comes either after "--" (flags.command) or,
// torchrun-style, as the first argument that is not a flag (CLI11's remaining()).
std::vector<std::string> program_and_args(const LaunchFlags& flags, std::vector<std::string> rest) {
  if (!flags.command.empty()) return flags.command;
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    DTORCH_FAIL(ConfigError, "unknown flag ", rest.front(),
                " (see `dtorch launch --help`); put the program after --, e.g. "
                "`dtorch launch --nproc-per-node 2 -- ./train`");
  }
  return rest;
}

}  // namespace

void add_launch_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<launch::LaunchOptions>();
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start PROGRAM on N workers per node with torchrun's environment (RANK, WORLD_SIZE, "
      "MASTER_ADDR, ...), prefix their output with [n<node> r<rank>], and stop all of them "
      "when one fails");
  sub->add_option("--nproc-per-node,--nproc_per_node", flags->nproc_per_node,
                  "workers on this node: a number, or cpu/auto (one per core), gpu")
      ->capture_default_str();
  sub->add_option("--nnodes", flags->nnodes,
                  "nodes in the job: N, or MIN:MAX with --rdzv-backend c10d (goes on while at "
                  "least MIN are left, takes in nodes that come later up to MAX)")
      ->capture_default_str();
  sub->add_option("--node-rank,--node_rank", opts->node_rank, "this node's index, 0..nnodes-1")
      ->capture_default_str();
  sub->add_option("--master-addr,--master_addr", opts->master_addr,
                  "host of node 0, where its launcher serves the rendezvous store")
      ->capture_default_str();
  sub->add_option("--master-port,--master_port", opts->master_port,
                  "port of the rendezvous store on the master")
      ->capture_default_str();
  sub->add_option("--rdzv-listen,--rdzv_listen", opts->rdzv_listen,
                  "where a store this launcher serves listens: auto (the address --master-addr "
                  "or --rdzv-endpoint resolves to here; 127.0.0.1 for one node), all (every "
                  "interface) or an address of this host")
      ->capture_default_str();
  sub->add_flag("--standalone", opts->standalone,
                "single node on 127.0.0.1 and a free port (ignores --master-addr/--master-port)");
  sub->add_option("--max-restarts,--max_restarts", opts->max_restarts,
                  "restart the whole group up to this many times after a worker fails")
      ->capture_default_str();
  sub->add_option("--show-ranks,--show_ranks", opts->show_ranks,
                  "comma-separated global ranks whose output is shown (default: all)")
      ->delimiter(',');
  sub->add_option("--grace-period,--grace_period", opts->grace_seconds,
                  "seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  sub->add_option("--rdzv-timeout,--rdzv_timeout", opts->rdzv_timeout_seconds,
                  "seconds the nodes wait for each other to arrive (and the store for workers)")
      ->capture_default_str();
  sub->add_option("--rdzv-backend,--rdzv_backend", flags->rdzv_backend,
                  "static (each node given --node-rank) or c10d (nodes meet at --rdzv-endpoint "
                  "and are numbered on arrival; elastic with --nnodes MIN:MAX)")
      ->capture_default_str();
  sub->add_option("--rdzv-endpoint,--rdzv_endpoint", flags->rdzv_endpoint,
                  "HOST[:PORT] where the launchers meet (c10d: the launcher on HOST serves the "
                  "store; port 29400 if none; static: node 0, like --master-addr/--master-port)");
  sub->add_option("--rdzv-conf,--rdzv_conf", flags->rdzv_conf,
                  "key=value,... : join_timeout, last_call_timeout, close_timeout, "
                  "keep_alive_interval (seconds), keep_alive_max_attempt");
  sub->add_option("--rdzv-id,--rdzv_id,--run-id,--run_id", opts->run_id,
                  "job id given to workers as TORCHELASTIC_RUN_ID (default: none, or random "
                  "with --standalone)");
  add_choice_option(sub, "--checkpoint-signal", opts->checkpoint_signal,
                    "the signal that asks the workers to checkpoint and stop (dtorch train "
                    "finishes its step, saves, and exits 75), passed on to them; Slurm sends it "
                    "with #SBATCH --signal=USR1@90");
  sub->add_flag("--requeue-on-signal", opts->requeue_on_signal,
                "after the workers checkpointed on the checkpoint signal, `scontrol requeue "
                "$SLURM_JOB_ID` (node 0), so that the job runs again and resumes");
  sub->add_option("--timeout", opts->timeout_seconds,
                  "stop the job and fail after this many seconds (0: no limit)")
      ->capture_default_str();
  sub->add_option("--log-dir,--log_dir", opts->log_dir,
                  "also write each worker's output to DIR/rank<global rank>.log");
  // (description() apart: CLI11 2.3 under C++20, as LibTorch 2.x builds, cannot choose between
  // add_flag's overloads for a flag name and a string literal)
  sub->add_flag("--no-python,--no_python")
      ->description("accepted for torchrun compatibility: dtorch always runs PROGRAM itself");

  // Note [Program after the flags]
  // torchrun takes `torchrun FLAGS PROGRAM ARGS...` and `torchrun FLAGS -- PROGRAM ARGS...`.
  // CLI11 hands everything from the first non-flag on to remaining() (prefix_command), but
  // after "--" it would pass the rest up to the main app, which rejects it. So a positional
  // option collects the words after "--", and its check lets it take a word only once "--"
  // was seen (CLI11 records "--" in remaining()); otherwise prefix_command takes over.
  sub->add_option("command", flags->command, "PROGRAM [ARGS...], best after --")
      ->check(CLI::Validator(
          [sub](std::string&) -> std::string {
            auto seen = sub->remaining();
            return std::find(seen.begin(), seen.end(), "--") != seen.end() ? "" : "before --";
          },
          "", ""));
  sub->validate_positionals();
  sub->prefix_command();
  sub->footer(
      "Example: dtorch launch --standalone --nproc-per-node 2 -- ./train --epochs 1\n"
      "Exit code: 0 when every worker exits 0; else the failed worker's code (128+signal if it "
      "was killed), 124 after --timeout, 130/143 after SIGINT/SIGTERM, 75 when the workers "
      "checkpointed on --checkpoint-signal and stopped.");

  sub->callback([sub, opts, flags, &exit_code] {
    launch::LaunchOptions o = *opts;
    o.nproc_per_node = parse_nproc(flags->nproc_per_node);
    launch::NodeRange nodes = launch::parse_node_range(flags->nnodes);
    o.min_nodes = nodes.min;
    o.nnodes = nodes.max;
    o.rdzv_backend = launch::parse_rdzv_backend(flags->rdzv_backend);
    o.rdzv_conf = launch::parse_rdzv_conf(flags->rdzv_conf);
    const bool c10d = o.rdzv_backend == launch::RdzvBackend::C10d;
    if (!flags->rdzv_endpoint.empty()) {
      o.rdzv_endpoint = launch::parse_endpoint(flags->rdzv_endpoint, c10d ? 29400 : o.master_port);
      if (!c10d) {  // torchrun's static backend meets at the endpoint: node 0's address and port
        o.master_addr = o.rdzv_endpoint.host;
        o.master_port = o.rdzv_endpoint.port;
      }
    }
    if (!c10d) {
      // Inside a Slurm/PBS/MPI job the node flags default to the job's (explicit flags win).
      bool endpoint = !flags->rdzv_endpoint.empty();
      std::string filled =
          launch::fill_nodes_from_job(o, {sub->count("--nnodes") > 0, sub->count("--node-rank") > 0,
                                          sub->count("--master-addr") > 0 || endpoint,
                                          sub->count("--master-port") > 0 || endpoint});
      if (!filled.empty()) log::info(filled);
    }
    o.command = program_and_args(*flags, sub->remaining());
    o.forked_main = forked_workers_for(o.command);
    exit_code = launch::run(o);
  });
}

}  // namespace dtorch::tools
