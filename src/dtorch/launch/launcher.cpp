// `dtorch launch`: checks the options, serves the rendezvous store on node 0, and runs a job of
// one node, restarting all its workers when one fails or ending it, naming the rank. Starting
// and watching the workers is worker_supervision.cpp's; jobs of several nodes run in rounds
// (launcher_rounds.cpp).
#include "dtorch/launch/launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/launcher_internal.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/store.h"
#include "dtorch/launch/store_listen.h"

extern char** environ;

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

void validate(const LaunchOptions& o) {
  DTORCH_CHECK_T(ConfigError, !o.command.empty() && !o.command[0].empty(),
                 "no program to run; put it after the flags, e.g. "
                 "`dtorch launch --nproc-per-node 2 -- ./train --epochs 1`");
  if (o.requeue_on_signal) {
    DTORCH_CHECK_T(ConfigError, o.checkpoint_signal != CheckpointSignal::Off,
                   "--requeue-on-signal requeues the job once its workers checkpointed on the "
                   "checkpoint signal, but --checkpoint-signal is off; give USR1 or USR2");
    DTORCH_CHECK_T(ConfigError, env::get("SLURM_JOB_ID").has_value(),
                   "--requeue-on-signal puts a Slurm job back in the queue, but SLURM_JOB_ID is "
                   "not set: use it in an sbatch script, or leave it out");
  }
  DTORCH_CHECK_T(ConfigError, o.nproc_per_node >= 1, "--nproc-per-node=", o.nproc_per_node,
                 " must be at least 1 (workers to start on this node)");
  DTORCH_CHECK_T(ConfigError, o.nnodes >= 1, "--nnodes=", o.nnodes, " must be at least 1");
  DTORCH_CHECK_T(ConfigError, static_cast<long long>(o.nnodes) * o.nproc_per_node <= (1 << 20),
                 "--nnodes=", o.nnodes, " times --nproc-per-node=", o.nproc_per_node,
                 " is more ranks than dtorch supports (2^20)");
  const bool c10d = o.rdzv_backend == RdzvBackend::C10d;
  const int lo = min_nodes(o);
  DTORCH_CHECK_T(ConfigError, c10d || lo == o.nnodes, "--nnodes=", lo, ":", o.nnodes,
                 " is an elastic range, which needs --rdzv-backend c10d and "
                 "--rdzv-endpoint HOST[:PORT]; or give one number");
  DTORCH_CHECK_T(ConfigError, lo >= 1 && lo <= o.nnodes, "--nnodes=", lo, ":", o.nnodes,
                 " must have 1 <= MIN <= MAX");
  DTORCH_CHECK_T(ConfigError, c10d || (o.node_rank >= 0 && o.node_rank < o.nnodes),
                 "--node-rank=", o.node_rank, " must be in 0..", o.nnodes - 1,
                 " for --nnodes=", o.nnodes,
                 " (nodes are numbered from 0; node 0 serves the rendezvous)");
  DTORCH_CHECK_T(ConfigError, !o.standalone || o.nnodes == 1, "--standalone runs one node, but ",
                 "--nnodes=", o.nnodes, "; drop --standalone and give every node the same ",
                 "--master-addr and --master-port");
  DTORCH_CHECK_T(ConfigError, !o.standalone || !c10d, "--standalone makes its own rendezvous on ",
                 "this host; drop it to meet other nodes at --rdzv-endpoint");
  if (c10d) {
    DTORCH_CHECK_T(ConfigError, !o.rdzv_endpoint.host.empty(),
                   "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT], the same on every "
                   "node (the host whose launcher serves the rendezvous store)");
  } else if (!o.standalone) {
    // Port 0 ("any free port") only works when no other node needs to know the port.
    DTORCH_CHECK_T(
        ConfigError,
        (o.master_port >= 1 && o.master_port <= 65535) || (o.master_port == 0 && o.nnodes == 1),
        "--master-port=", o.master_port,
        " is not a TCP port; use 1..65535, or --standalone for a free one");
    DTORCH_CHECK_T(ConfigError, !o.master_addr.empty(),
                   "--master-addr is empty; give the host name or address of node 0");
  }
  DTORCH_CHECK_T(ConfigError, o.max_restarts >= 0, "--max-restarts=", o.max_restarts,
                 " must be 0 or more");
  DTORCH_CHECK_T(ConfigError, o.grace_seconds >= 0, "--grace-period=", o.grace_seconds,
                 " must be 0 or more seconds");
  DTORCH_CHECK_T(ConfigError, o.rdzv_timeout_seconds > 0, "--rdzv-timeout=", o.rdzv_timeout_seconds,
                 " must be more than 0 seconds");
  DTORCH_CHECK_T(ConfigError, o.timeout_seconds >= 0, "--timeout=", o.timeout_seconds,
                 " must be 0 (no limit) or more seconds");
  int world = o.nnodes * o.nproc_per_node;  // with c10d: the most it can be
  for (int r : o.show_ranks) {
    DTORCH_CHECK_T(ConfigError, r >= 0 && r < world, "--show-ranks names rank ", r,
                   " but the job has ranks 0..", world - 1);
  }
}

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<unsigned> hex(0, 15);
  std::string id;
  for (int i = 0; i < 12; ++i)
    id += "0123456789abcdef"[hex(rd)];
  return id;
}

// A private folder for the workers' error files, removed when the launcher ends.
struct ErrorDir {
  std::string path;
  ErrorDir() {
    std::error_code ec;
    path = paths::make_temp_directory("dtorch_launch", ec);
  }
  ~ErrorDir() {
    std::error_code ec;
    if (!path.empty()) paths::remove_all(path, ec);
  }
  ErrorDir(const ErrorDir&) = delete;
  ErrorDir& operator=(const ErrorDir&) = delete;
};

std::map<std::string, std::string> launcher_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

// `scontrol requeue $SLURM_JOB_ID`: the job goes back to the queue, and its next run resumes
// from the checkpoint. scontrol gets 30 s; what fails is said, and the job just ends.
void requeue_slurm_job(Console& console) {
  const std::string job = env::get("SLURM_JOB_ID").value_or("");
  const std::string command = "scontrol requeue " + job;
  std::vector<std::string> words{"scontrol", "requeue", job};
  std::vector<char*> argv;
  for (std::string& w : words)
    argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawnp(&pid, "scontrol", nullptr, nullptr, argv.data(), environ);
  if (spawned != 0) {
    console.message(str("dtorch launch: cannot run `", command, "` (", std::strerror(spawned),
                        "); resubmit the job: it resumes from its checkpoint"));
    return;
  }
  int status = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    console.message(str("dtorch launch: `", command,
                        "` did not answer within 30 s; resubmit the job: it resumes from its "
                        "checkpoint"));
    return;
  }
  if (done > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    console.message(str("dtorch launch: `", command,
                        "`: the job goes back to the queue and resumes from its checkpoint"));
  } else {
    console.message(str("dtorch launch: `", command, "` failed (", describe_status(status),
                        "); resubmit the job: it resumes from its checkpoint (is it "
                        "requeueable? #SBATCH --requeue)"));
  }
}

int run_plan(const Plan& plan, Console& console) {
  const LaunchOptions& o = plan.opts;
  SignalWatch signals(signal_number(o.checkpoint_signal));
  std::optional<Clock::time_point> deadline;
  if (o.timeout_seconds > 0) {
    deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.timeout_seconds * 1000));
  }
  for (int attempt = 0;; ++attempt) {
    AttemptEnd end;
    try {
      end = run_attempt(plan, attempt, console, signals, deadline);
    } catch (const SpawnError& e) {
      console.message(str("dtorch launch: ", e.what()));
      return e.exit_code();
    }
    switch (end.how) {
      case End::Success:
        return 0;
      case End::Checkpointed:
        return checkpointed(plan, console);
      case End::Signalled:
      case End::TimedOut:
        return stopped_by_launcher(end, o, console);
      case End::WorkerFailed:
      case End::RoundEnded:  // only with a watch, which elastic jobs have
        break;
    }
    std::string failure = describe_failure(plan, end.failure);
    console.message(failure);
    plan.logs->write(end.failure.local_rank, failure + "\n");
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0) {
        console.message(
            str("dtorch launch: giving up after ", o.max_restarts, " restart(s) (--max-restarts)"));
      }
      return exit_code_of(end.failure.status);
    }
    console.message(str("dtorch launch: restarting all workers (restart ", attempt + 1, " of ",
                        o.max_restarts, ")"));
  }
}

}  // namespace

// ---- shared with launcher_rounds.cpp (launcher_internal.h) ----------------------------------

int min_nodes(const LaunchOptions& o) {
  return o.min_nodes > 0 ? o.min_nodes : o.nnodes;
}

c10::intrusive_ptr<c10d::Store> connect_to_node_zero(const Plan& plan) {
  const LaunchOptions& o = plan.opts;
  auto timeout = std::chrono::milliseconds(static_cast<long long>(o.rdzv_timeout_seconds * 1000));
  if (o.node_rank != 0) return connect_store(plan.master_addr, plan.master_port, timeout);
  // The store is local: a working address answers at once, so do not wait long on a bad one.
  try {
    return connect_store(plan.master_addr, plan.master_port,
                         std::min(timeout, std::chrono::milliseconds(30000)));
  } catch (const CommError& e) {
    std::string why = e.what();
    DTORCH_FAIL(
        CommError, "node 0 serves the rendezvous store on port ", plan.master_port,
        " but cannot reach it through --master-addr ", plan.master_addr,
        ", so the other nodes and the workers could not either: ", why.substr(0, why.find('\n')),
        "\n---> HINT: give --master-addr a name or address of this host (node 0) "
        "that every node can reach");
  }
}

std::string listen_address(const LaunchOptions& o, const std::string& host, Console& console) {
  const ListenPlan plan = plan_listen(o.rdzv_listen, host, o.nnodes > 1);
  if (!plan.note.empty()) console.message("dtorch launch: " + plan.note);
  return plan.address;
}

int stopped_by_launcher(const AttemptEnd& end, const LaunchOptions& o, Console& console) {
  if (end.how == End::Signalled) {
    console.message(str("dtorch launch: got ", signal_name(end.signal), "; stopped all workers"));
    return 128 + end.signal;
  }
  console.message(str("dtorch launch: the job exceeded its time limit of ", o.timeout_seconds,
                      " s (--timeout); stopped all workers"));
  return 124;
}

int checkpointed(const Plan& plan, Console& console) {
  console.message(str("dtorch launch: the workers checkpointed on ",
                      signal_name(signal_number(plan.opts.checkpoint_signal)),
                      " and stopped (exit ", kCheckpointedExitCode, ")"));
  if (plan.opts.requeue_on_signal && plan.opts.node_rank == 0) requeue_slurm_job(console);
  return kCheckpointedExitCode;
}

int run(const LaunchOptions& opts) {
  validate(opts);
  Console console;
  Plan plan;
  plan.opts = opts;
  plan.world_size = opts.nnodes * opts.nproc_per_node;
  plan.run_id = opts.run_id;
  plan.env = launcher_env();
  try {
    plan.program_path = resolve_program(opts.command[0]);
  } catch (const SpawnError& e) {
    console.message(str("dtorch launch: ", e.what()));
    return e.exit_code();
  }
  for (const auto& [k, v] : opts.env)
    plan.env[k] = v;
  if (opts.nnodes > 1) plan.host = short_hostname();
  if (opts.nproc_per_node > 1 && plan.env.find("OMP_NUM_THREADS") == plan.env.end()) {
    // Like torchrun: N workers each starting one OpenMP thread per core would fight for cores.
    plan.env["OMP_NUM_THREADS"] = "1";
    console.message(str("dtorch launch: setting OMP_NUM_THREADS=1 for each of the ",
                        opts.nproc_per_node,
                        " workers so they do not oversubscribe the cores; set it to tune"));
  }
  if (plan.run_id.empty()) plan.run_id = opts.standalone ? random_run_id() : "none";
  // Before the store's server and its watchdog start their threads (Note [Forked workers]).
  std::optional<WorkerForks> forks;
  if (opts.forked_main) plan.forks = &forks.emplace(opts.nproc_per_node, opts.forked_main);
  ErrorDir error_dir;
  plan.error_dir = error_dir.path;
  const bool c10d = opts.rdzv_backend == RdzvBackend::C10d;
  // A static job's node 0 serves the store for the whole run, restarts included, so workers
  // that come back find it where it was (TORCHELASTIC_USE_AGENT_STORE=True).
  c10::intrusive_ptr<c10d::Store> store;
  plan.master_addr = opts.standalone ? "127.0.0.1" : opts.master_addr;
  plan.master_port = opts.master_port;
  if (!c10d && opts.node_rank == 0) {
    store = serve_store(
        opts.standalone ? 0 : opts.master_port, plan.world_size,
        std::chrono::milliseconds(static_cast<long long>(opts.rdzv_timeout_seconds * 1000)),
        listen_address(opts, plan.master_addr, console));
    plan.master_port = served_port(store);
    claim_store_for_job(*store, plan.run_id, str("port ", plan.master_port));
  }
  if (c10d || opts.nnodes > 1) {  // Note [One rendezvous for launchers]
    try {
      return run_rounds(plan, console, store);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = e.what();
      DTORCH_FAIL(CommError, "the rendezvous store at ",
                  c10d ? opts.rdzv_endpoint.host : plan.master_addr, ":",
                  c10d ? opts.rdzv_endpoint.port : plan.master_port, " failed (",
                  why.substr(0, why.find('\n')),
                  "): the launcher on that host has probably ended; see its log");
    }
  }
  // One node: nothing to meet, but the workers reach the store through --master-addr.
  if (!opts.standalone) connect_to_node_zero(plan);
  RankLogs logs(opts);
  plan.logs = &logs;
  log::debug("launch: ", opts.nproc_per_node, " worker(s) on node ", opts.node_rank, " of ",
             opts.nnodes, " (world size ", plan.world_size, "), store at ", plan.master_addr, ":",
             plan.master_port, " (served here), run id ", plan.run_id, ", max restarts ",
             opts.max_restarts, ", program ", plan.program_path);
  return run_plan(plan, console);
}

}  // namespace dtorch::launch