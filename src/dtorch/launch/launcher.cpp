// `dtorch launch`: serves the rendezvous store on node 0, starts the workers with torchrun's
// environment, relays their output line by line with "[n<node> r<rank>] " in front, and tears
// the group down (then restarts it or fails, naming the rank) as soon as one worker fails.
#include "dtorch/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtorch/core/env.h"
#include "dtorch/core/error.h"
#include "dtorch/core/log.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/launch/elastic_rendezvous.h"
#include "dtorch/launch/line_prefixer.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/signals.h"
#include "dtorch/launch/store.h"
#include "dtorch/launch/store_listen.h"

extern char** environ;

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A hidden rank's (--show-ranks) recent stderr, printed if it fails, so its error is not lost.
constexpr std::size_t kHiddenTailBytes = 4096;
// How much a worker may still have in its pipes when it exits; more is a grandchild's.
constexpr std::size_t kExitDrainBytes = 4 << 20;

int min_nodes(const LaunchOptions& o) {
  return o.min_nodes > 0 ? o.min_nodes : o.nnodes;
}

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

bool same_file(int a, int b) {
  struct stat sa, sb;
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return;  // closed reader (EPIPE) or a full disk: drop output rather than stop the job
    }
  }
}

// The launcher's stdout and stderr, shared by every worker's output and the launcher's own
// messages.
//
// Note [Progress bars among other output]
// A worker's '\r' update leaves the cursor at the start of its line (see Note [Carriage
// returns]). When anyone else writes next to the same file, the launcher first ends that line
// with '\n', so the bar stays readable and the other line is not written over it.
class Console {
 public:
  Console() : shared_(same_file(STDOUT_FILENO, STDERR_FILENO)) {}

  /// `fd` is STDOUT_FILENO or STDERR_FILENO; `owner` identifies the writer.
  void write(int fd, int owner, const std::string& text) {
    if (text.empty()) return;
    int& cr_owner = cr_owner_[shared_ ? 0 : fd == STDERR_FILENO];
    if (cr_owner != kNone && cr_owner != owner) write_all(fd, "\n", 1);
    write_all(fd, text.data(), text.size());
    // Bare '\r's move no text: whatever was pending stays pending.
    if (text.find_first_not_of('\r') != std::string::npos)
      cr_owner = text.back() == '\r' ? owner : kNone;
  }
  /// A line of the launcher's own, on stderr.
  void message(const std::string& line) {
    write(STDERR_FILENO, kLauncher, without_locations(line) + "\n");
  }

 private:
  static constexpr int kNone = -1;
  static constexpr int kLauncher = -2;
  bool shared_;
  int cr_owner_[2] = {kNone, kNone};
};

// Note [Log files]
// torchrun's --log-dir writes LOG_DIR/<run id>_<random>/attempt_<n>/<local rank>/stdout.log and
// stderr.log, and only for the streams named by --redirects or --tee. dtorch writes one file per
// global rank, LOG_DIR/rank<rank>.log: both streams, unprefixed, whole lines in the order they
// arrived, with each restart and the launcher's verdict on a failed rank written into it. The
// name alone says whose output it is, also in a folder that all nodes share, and no second flag
// is needed. The console keeps the prefixed stream of the ranks --show-ranks selects.
class RankLogs {
 public:
  /// `append`: keep what earlier rounds of an elastic job wrote (Note [Elastic rendezvous]).
  explicit RankLogs(const LaunchOptions& o, bool append = false) {
    if (o.log_dir.empty()) return;
    std::error_code ec;
    paths::create_directories(o.log_dir, ec);
    DTORCH_CHECK_T(ConfigError, !ec, "cannot create --log-dir ", o.log_dir, ": ", ec.message());
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      std::string path = str(o.log_dir, "/rank", o.node_rank * o.nproc_per_node + lr, ".log");
      int fd = ::open(path.c_str(),
                      O_WRONLY | O_CREAT | (append ? 0 : O_TRUNC) | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) {
        int e = errno;
        close_all();
        DTORCH_FAIL(ConfigError, "cannot write the log file ", path,
                    " (--log-dir): ", std::strerror(e));
      }
      fds_.push_back(fd);
    }
  }
  ~RankLogs() { close_all(); }
  RankLogs(const RankLogs&) = delete;
  RankLogs& operator=(const RankLogs&) = delete;

  /// The file of local rank `lr`, or -1 without --log-dir.
  int fd(int lr) const { return fds_.empty() ? -1 : fds_[static_cast<std::size_t>(lr)]; }

  void write(int lr, const std::string& text) const {
    if (fd(lr) >= 0) write_all(fd(lr), text.data(), text.size());
  }

 private:
  void close_all() {
    for (int fd : fds_)
      ::close(fd);
    fds_.clear();
  }
  std::vector<int> fds_;
};

// Everything that is the same for every attempt.
struct Plan {
  LaunchOptions opts;  // an elastic job's rounds each set node_rank and nnodes
  std::string program_path;
  std::string master_addr;
  int master_port = 0;
  int world_size = 0;
  std::string run_id;
  std::map<std::string, std::string> env;  // launcher env + opts.env (+ OMP_NUM_THREADS)
  std::string host;  // in the line prefix of jobs on several nodes; empty on one node
  const RankLogs* logs = nullptr;
  std::string error_dir;  // TORCHELASTIC_ERROR_FILE lives under it
  /// TORCHELASTIC_USE_AGENT_STORE: the launcher serves the workers' store (else rank 0 does).
  bool agent_store = true;
  int round = -1;  // an elastic job's round (DTORCH_ELASTIC_ROUND); -1 for a static job
};

// torchrun's TORCHELASTIC_ERROR_FILE: a program whose entry point PyTorch's @record wraps writes
// its exception there, and the launcher shows it when the worker fails.
std::string error_file(const Plan& plan, int attempt, int local_rank) {
  return str(plan.error_dir, "/attempt_", attempt, "/", local_rank, "/error.json");
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

// The message a failed worker left in its error file, or "".
std::string error_file_message(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  try {
    auto j = nlohmann::json::parse(in);
    const auto& m = j.at("message");
    return m.is_string() ? m.get<std::string>() : m.at("message").get<std::string>();
  } catch (const std::exception&) {
    return "";
  }
}

std::vector<std::string> worker_env(const Plan& plan, int local_rank, int attempt) {
  const LaunchOptions& o = plan.opts;
  int rank = o.node_rank * o.nproc_per_node + local_rank;
  std::map<std::string, std::string> env = plan.env;
  // torchrun's variables win over inherited ones: a launcher inside a launcher must not leak.
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(plan.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(o.nnodes);
  env["ROLE_NAME"] = "default";
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(plan.world_size);
  env["MASTER_ADDR"] = plan.master_addr;
  env["MASTER_PORT"] = std::to_string(plan.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = plan.run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = plan.agent_store ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = error_file(plan, attempt, local_rank);
  // Note [Torchrun's environment by version]
  // Workers see what the torchrun of their PyTorch would give them: 2.x adds the two
  // variables below, and 1.13's c10d backend has rank 0 serve the workers' store
  // (TORCHELASTIC_USE_AGENT_STORE=False) where 2.x has node 0's agent serve it.
  if (compat::kTorch2) {
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
    if (!env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  }
  // A later round of an elastic job restarts workers also when no failure counted (a node
  // joined), so TORCHELASTIC_RESTART_COUNT may be 0: this tells dtorch train to resume.
  if (plan.round >= 0) env["DTORCH_ELASTIC_ROUND"] = std::to_string(plan.round);
  // Every output line already starts with [n<node> r<rank>]; dtorch's log need not repeat it.
  env["DTORCH_OUTPUT_PREFIXED"] = "1";
  // Rank 0's progress bar draws through a pipe; this tells it a person is watching.
  if (::isatty(STDERR_FILENO)) {
    env["DTORCH_STDERR_TTY"] = "1";
  } else {
    env.erase("DTORCH_STDERR_TTY");
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env)
    out.push_back(k + "=" + v);
  return out;
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  bool shown = true;
  Child child;
  bool running = false;
  int status = 0;
  LinePrefixer out{""};
  LinePrefixer err{""};
  // Note [Log files]: the same streams, unprefixed, for this rank's file.
  LinePrefixer log_out{""};
  LinePrefixer log_err{""};
  std::string hidden_err_tail;
};

struct Failure {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  int status = 0;
  std::string hidden_err_tail;
  std::string error_file;
};

// RoundEnded: the watch (an elastic job's rendezvous) asked the workers to stop. Checkpointed:
// every worker ended well, some after checkpointing on the checkpoint signal (Note [Checkpoint
// on a signal]).
enum class End { Success, WorkerFailed, Signalled, TimedOut, RoundEnded, Checkpointed };

struct AttemptEnd {
  End how = End::Success;
  Failure failure;  // End::WorkerFailed
  int signal = 0;   // End::Signalled
};

// One start of the whole group, watched until every worker has ended.
class Attempt {
 public:
  /// `watch`, when given, is asked about twice a second whether to stop the workers.
  Attempt(const Plan& plan, int attempt, Console& console, SignalWatch& signals,
          std::optional<Clock::time_point> deadline, std::function<bool()> watch = nullptr)
      : plan_(plan),
        attempt_(attempt),
        console_(console),
        signals_(signals),
        deadline_(deadline),
        watch_(std::move(watch)) {}

  // Whatever way run() leaves (an exception included), no worker and nothing a worker started
  // is left behind.
  ~Attempt() {
    kill_running(SIGKILL);
    for (Worker& w : workers_) {
      if (w.running) reap_blocking(w);
      signal_group(w.child.pid, SIGKILL);
    }
  }

  AttemptEnd run() {
    start_all();
    while (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }))
      step();
    if (end_.how == End::Success && checkpointed_) end_.how = End::Checkpointed;
    return end_;
  }

 private:
  void start_all() {
    const LaunchOptions& o = plan_.opts;
    const auto& shown = o.show_ranks;
    workers_.resize(static_cast<std::size_t>(o.nproc_per_node));
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      Worker& w = workers_[static_cast<std::size_t>(lr)];
      w.local_rank = lr;
      w.rank = o.node_rank * o.nproc_per_node + lr;
      w.shown = shown.empty() || std::find(shown.begin(), shown.end(), w.rank) != shown.end();
      std::string prefix = rank_prefix(o.node_rank, w.rank, plan_.host);
      w.out = LinePrefixer(o.prefix_stdout ? prefix : "");
      w.err = LinePrefixer(prefix);
      std::error_code ec;
      paths::create_directories(paths::parent_path(error_file(plan_, attempt_, lr)), ec);
      paths::remove(error_file(plan_, attempt_, lr), ec);
      if (attempt_ > 0) {
        plan_.logs->write(lr, str("dtorch launch: restart ", attempt_, " of ", o.max_restarts,
                                  " (TORCHELASTIC_RESTART_COUNT=", attempt_, ")\n"));
      }
      // A SpawnError leaves through the destructor, which stops the workers already started.
      w.child = spawn(SpawnRequest{plan_.program_path, o.command, worker_env(plan_, lr, attempt_)});
      w.running = true;
    }
  }

  // One round of the monitor loop: sleep in poll() until output, a signal, a child's end or a
  // deadline, then handle whatever happened.
  void step() {
    std::vector<struct pollfd> fds{{signals_.wake_fd(), POLLIN, 0}};
    std::vector<std::pair<Worker*, int>> owners{{nullptr, 0}};
    for (Worker& w : workers_) {
      for (int fd : {w.child.out_fd, w.child.err_fd}) {
        if (fd < 0) continue;
        fds.push_back({fd, POLLIN, 0});
        owners.emplace_back(&w, fd);
      }
    }
    int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR)
      DTORCH_FAIL(Error, "launcher: poll failed: ", std::strerror(errno));
    for (std::size_t i = 1; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents) read_some(*owners[i].first, owners[i].second);
    }
    if (int sig = signals_.take_signal()) on_launcher_signal(sig);
    if (signals_.take_checkpoint_request() && !tearing_down()) on_checkpoint_signal();
    reap();
    auto now = Clock::now();
    if (deadline_ && now >= *deadline_ && !tearing_down()) {
      end_.how = End::TimedOut;
      tear_down(SIGTERM);
    }
    if (watch_ && !tearing_down() && now >= next_watch_) {
      next_watch_ = now + kWatchEvery;
      if (watch_()) {
        end_.how = End::RoundEnded;
        tear_down(SIGTERM);
      }
    }
    if (kill_at_ && now >= *kill_at_) {
      // A stopped (SIGSTOP) or hung worker ignores SIGTERM; say who needed the hard way.
      std::string left;
      for (const Worker& w : workers_)
        if (w.running) left += str(left.empty() ? "" : ", ", w.rank);
      if (!left.empty()) {
        console_.message(str("dtorch launch: rank(s) ", left, " still running ",
                             plan_.opts.grace_seconds, " s after SIGTERM (--grace-period); ",
                             "sending SIGKILL"));
      }
      kill_running(SIGKILL);
      kill_at_.reset();
    }
  }

  int poll_timeout_ms() const {
    // SIGCHLD wakes the loop; the 1 s tick is only a safety net for a missed wake-up.
    auto now = Clock::now();
    auto wait = std::chrono::milliseconds(1000);
    auto until = [&](Clock::time_point t) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - now) +
                  std::chrono::milliseconds(1);
      wait = std::max(std::chrono::milliseconds(0), std::min(wait, left));
    };
    if (deadline_ && !tearing_down()) until(*deadline_);
    if (kill_at_) until(*kill_at_);
    if (watch_ && !tearing_down()) until(next_watch_);
    return static_cast<int>(wait.count());
  }

  bool tearing_down() const { return end_.how != End::Success; }

  void tear_down(int sig) {
    for (const Worker& w : workers_)
      if (w.running && is_stopped(w.child.pid))
        console_.message(str("dtorch launch: rank ", w.rank, " (pid ", w.child.pid,
                             ") is stopped (SIGSTOP or ^Z); continuing it so that it can end"));
    kill_running(sig);
    // A stopped worker (SIGSTOP, ^Z, a debugger gone) keeps SIGTERM pending until it is
    // continued and would cost the whole grace period: continue it so that it can end now, as
    // systemd does.
    if (sig != SIGKILL) kill_running(SIGCONT);
    kill_at_ = Clock::now() +
               std::chrono::milliseconds(static_cast<long long>(plan_.opts.grace_seconds * 1000));
  }

  void kill_running(int sig) {
    for (Worker& w : workers_)
      if (w.running) signal_group(w.child.pid, sig);
  }

  void on_launcher_signal(int sig) {
    if (tearing_down() || signals_.signal_count() > 1) {
      kill_running(SIGKILL);  // asked again while stopping: stop waiting for a graceful end
      return;
    }
    end_ = AttemptEnd{End::Signalled, {}, sig};
    tear_down(sig);  // forward what the launcher got, like torchrun
  }

  // Note [Checkpoint on a signal]: the workers agree on a step, checkpoint after it and exit
  // with kCheckpointedExitCode; the launcher passes the signal on and waits for them.
  void on_checkpoint_signal() {
    const int sig = signal_number(plan_.opts.checkpoint_signal);
    console_.message(str("dtorch launch: got ", signal_name(sig),
                         "; asking every worker to checkpoint and stop"));
    kill_running(sig);
  }

  // Reads what one pipe has now; returns false at end of file.
  bool read_some(Worker& w, int fd) {
    ssize_t n;
    do {
      n = ::read(fd, buf_.data(), buf_.size());
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN) return true;
    bool is_err = fd == w.child.err_fd;
    std::string text, logged;
    LinePrefixer& log = is_err ? w.log_err : w.log_out;
    if (n > 0) {
      std::string_view chunk(buf_.data(), static_cast<std::size_t>(n));
      (is_err ? w.err : w.out).feed(chunk, text);
      if (has_log(w)) log.feed(chunk, logged);
    } else {
      (is_err ? w.err : w.out).finish(text);
      if (has_log(w)) log.finish(logged);
      ::close(fd);
      (is_err ? w.child.err_fd : w.child.out_fd) = -1;
    }
    emit(w, is_err, text);
    plan_.logs->write(w.local_rank, logged);
    return n > 0;
  }

  bool has_log(const Worker& w) const { return plan_.logs->fd(w.local_rank) >= 0; }

  void emit(Worker& w, bool is_err, const std::string& text) {
    if (text.empty()) return;
    if (w.shown) {
      console_.write(is_err ? STDERR_FILENO : STDOUT_FILENO, 2 * w.rank + is_err, text);
    } else if (is_err) {
      w.hidden_err_tail += text;
      if (w.hidden_err_tail.size() > 2 * kHiddenTailBytes)
        w.hidden_err_tail.erase(0, w.hidden_err_tail.size() - kHiddenTailBytes);
    }
  }

  void drain_and_close(Worker& w) {
    for (int* fd : {&w.child.out_fd, &w.child.err_fd}) {
      std::size_t total = 0;
      while (*fd >= 0 && total < kExitDrainBytes && read_some(w, *fd)) {
        total += buf_.size();
        struct pollfd p = {*fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;  // nothing more now: the worker wrote all it had
      }
      if (*fd >= 0) {
        std::string text, logged;
        (fd == &w.child.err_fd ? w.err : w.out).finish(text);
        emit(w, fd == &w.child.err_fd, text);
        (fd == &w.child.err_fd ? w.log_err : w.log_out).finish(logged);
        plan_.logs->write(w.local_rank, logged);
        ::close(*fd);
        *fd = -1;
      }
    }
  }

  void reap() {
    for (Worker& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = ::waitpid(w.child.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      if (r < 0) status = 0xff00;  // reaped by someone else (ECHILD): exit status unknown
      finished(w, status);
    }
  }

  void reap_blocking(Worker& w) {
    int status = 0;
    while (::waitpid(w.child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    finished(w, status);
  }

  void finished(Worker& w, int status) {
    w.running = false;
    w.status = status;
    drain_and_close(w);
    const bool checkpointed = WIFEXITED(status) && WEXITSTATUS(status) == kCheckpointedExitCode;
    checkpointed_ = checkpointed_ || checkpointed;
    bool ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) || checkpointed;
    if (ok || tearing_down()) return;  // deaths from our own teardown are not the cause
    end_.how = End::WorkerFailed;
    end_.failure = Failure{w.rank, w.local_rank,      w.child.pid,
                           status, w.hidden_err_tail, error_file(plan_, attempt_, w.local_rank)};
    tear_down(SIGTERM);
  }

  const Plan& plan_;
  int attempt_;
  Console& console_;
  SignalWatch& signals_;
  std::optional<Clock::time_point> deadline_;
  std::function<bool()> watch_;
  static constexpr std::chrono::milliseconds kWatchEvery{500};
  bool checkpointed_ = false;  // a worker exited with kCheckpointedExitCode
  Clock::time_point next_watch_ = Clock::now() + kWatchEvery;
  std::optional<Clock::time_point> kill_at_;
  std::vector<Worker> workers_;
  AttemptEnd end_;
  std::vector<char> buf_ = std::vector<char>(64 * 1024);  // off the stack: run() may be deep
};

std::string describe_failure(const Plan& plan, const Failure& f) {
  std::string s =
      str("dtorch launch: rank ", f.rank, " (node ", plan.opts.node_rank, ", local rank ",
          f.local_rank, ", pid ", f.pid, ") ", describe_status(f.status));
  if (std::string m = error_file_message(f.error_file); !m.empty())
    s += str("\ndtorch launch: rank ", f.rank, "'s error file (TORCHELASTIC_ERROR_FILE) says: ", m);
  if (WIFSIGNALED(f.status) && WTERMSIG(f.status) == SIGKILL) {
    s += "\n---> HINT: nobody in this launcher sent that SIGKILL; the out-of-memory killer "
         "is the usual sender (see `dmesg`)";
  }
  if (!f.hidden_err_tail.empty()) {
    std::string tail = f.hidden_err_tail;
    if (tail.size() > kHiddenTailBytes) {
      tail.erase(0, tail.size() - kHiddenTailBytes);
      tail.erase(0, tail.find('\n') + 1);
    }
    if (!tail.empty() && tail.back() != '\n') tail += '\n';
    s += str("\ndtorch launch: the end of rank ", f.rank, "'s stderr (hidden by --show-ranks):\n",
             tail.substr(0, tail.size() - 1));
  }
  return s;
}

std::map<std::string, std::string> launcher_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

// A static job's connection to node 0's store. Every node's launcher, node 0's included,
// connects through --master-addr as its workers will: an address that does not reach node 0
// fails here, by name, before any worker starts.
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

// Where a store this launcher serves for clients that reach it through `host` listens (Note
// [Where the store listens]), saying so when that is every interface though not asked.
std::string listen_address(const LaunchOptions& o, const std::string& host, Console& console) {
  const ListenPlan plan = plan_listen(o.rdzv_listen, host, o.nnodes > 1);
  if (!plan.note.empty()) console.message("dtorch launch: " + plan.note);
  return plan.address;
}

// The exit code of a group the launcher itself stopped (a signal it got, or --timeout).
int stopped_by_launcher(const AttemptEnd& end, const LaunchOptions& o, Console& console) {
  if (end.how == End::Signalled) {
    console.message(str("dtorch launch: got ", signal_name(end.signal), "; stopped all workers"));
    return 128 + end.signal;
  }
  console.message(str("dtorch launch: the job exceeded its time limit of ", o.timeout_seconds,
                      " s (--timeout); stopped all workers"));
  return 124;
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

// The exit code of a group whose workers checkpointed on the checkpoint signal (Note
// [Checkpoint on a signal]); node 0 first puts a Slurm job back in the queue when asked.
int checkpointed(const Plan& plan, Console& console) {
  console.message(str("dtorch launch: the workers checkpointed on ",
                      signal_name(signal_number(plan.opts.checkpoint_signal)),
                      " and stopped (exit ", kCheckpointedExitCode, ")"));
  if (plan.opts.requeue_on_signal && plan.opts.node_rank == 0) requeue_slurm_job(console);
  return kCheckpointedExitCode;
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
      end = Attempt(plan, attempt, console, signals, deadline).run();
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

// A c10d round's store for its workers: node 0 serves it on a free port (or, for LibTorch
// 1.13's workers, leaves the port to rank 0) and publishes where; the other nodes read it.
c10::intrusive_ptr<c10d::Store> round_store(Plan& plan, const Round& round, ElasticRendezvous& rdzv,
                                            std::chrono::milliseconds timeout, Console& console) {
  plan.round = round.number;
  plan.agent_store = compat::kTorch2;  // Note [Torchrun's environment by version]
  c10::intrusive_ptr<c10d::Store> store;
  if (round.node_rank == 0) {
    plan.master_addr = fqdn();
    if (plan.agent_store) {
      store = serve_store(0, plan.world_size, timeout,
                          listen_address(plan.opts, plan.master_addr, console));
      plan.master_port = served_port(store);
      claim_store_for_job(*store, plan.run_id, str("port ", plan.master_port));
    } else {
      plan.master_port = free_port();
    }
    rdzv.publish("master", plan.master_addr + " " + std::to_string(plan.master_port));
  } else {
    std::string m = rdzv.read("master");
    plan.master_addr = m.substr(0, m.find(' '));
    plan.master_port = static_cast<int>(number_in_store(m.substr(m.find(' ') + 1), "master"));
  }
  return store;
}

// Note [One rendezvous for launchers]
// Every job of several nodes runs in rounds of Note [Elastic rendezvous]. A c10d job's
// launchers meet at --rdzv-endpoint, are numbered on arrival and go on with MIN..MAX nodes;
// each round's node 0 serves a fresh store for the workers on a free port and gives them its
// host name (torchrun's MASTER_ADDR and MASTER_PORT), so workers of one round never meet keys
// of another. A static job (--node-rank given) is the same rounds with the node ranks given and
// MIN = MAX = --nnodes: node 0's launcher serves the store at --master-addr:--master-port for
// the whole job, the launchers meet there, and the workers use it too (each restart in a
// namespace of its own, TORCHELASTIC_RESTART_COUNT). So a static job's nodes watch each
// other's heartbeats, a failed worker stops and restarts every node's workers together (or
// ends the job, naming the rank, on every node), and a node whose launcher is lost ends the job
// within the heartbeat's timeout.
int run_rounds(const Plan& base, Console& console, c10::intrusive_ptr<c10d::Store> served) {
  const LaunchOptions& o = base.opts;
  const bool fixed = o.rdzv_backend == RdzvBackend::Static;
  const RdzvConf& conf = o.rdzv_conf;
  const double join_s =
      !fixed && conf.join_timeout_given ? conf.join_timeout : o.rdzv_timeout_seconds;
  const auto join_ms = std::chrono::milliseconds(static_cast<long long>(join_s * 1000));
  const Endpoint at = fixed ? Endpoint{base.master_addr, base.master_port} : o.rdzv_endpoint;
  // The endpoint's host serves the store; with several launchers on that host, the first does.
  if (!fixed && is_local_host(at.host)) {
    try {
      served = serve_store(at.port, 1, join_ms, listen_address(o, at.host, console));
    } catch (const CommError&) {
      log::debug("launch: the rendezvous store on port ", at.port,
                 " is served already (another launcher on this host)");
    }
  }
  auto connect = [&] { return connect_store(at.host, at.port, join_ms); };
  ElasticConfig cfg;
  cfg.run_id = base.run_id;
  cfg.endpoint = str(at.host, ":", at.port);
  cfg.min_nodes = min_nodes(o);
  cfg.max_nodes = o.nnodes;
  cfg.conf = conf;
  cfg.conf.join_timeout = join_s;
  cfg.max_restarts = o.max_restarts;
  cfg.host = short_hostname();
  if (fixed) {
    cfg.node_rank = o.node_rank;
    cfg.join_timeout_flag = "--rdzv-timeout";
  }
  ElasticRendezvous rdzv(fixed ? connect_to_node_zero(base) : connect(), connect, cfg);
  const ElasticRendezvous::Waiting waiting = [&](const std::string& who, double seconds) {
    console.message(str("dtorch launch: ", fixed ? str("node ", o.node_rank, " ") : "",
                        "waiting for the other nodes at ", at.host, ":", at.port, " for ",
                        std::lround(seconds), " s of ", fixed ? "--rdzv-timeout" : "join_timeout",
                        " ", join_s, " s: ", who));
  };
  std::optional<Clock::time_point> deadline;
  if (o.timeout_seconds > 0) {
    deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<long long>(o.timeout_seconds * 1000));
  }
  // Note [Elastic rendezvous]: whoever serves a store keeps it until the others are done with it.
  auto leave = [&](bool serving, int code) {
    if (serving) {
      rdzv.wait_for_peers(conf.close_timeout, [&](const std::string& hosts) {
        console.message(str("dtorch launch: keeping the rendezvous store up until ", hosts,
                            " leave the job (at most ", conf.close_timeout,
                            " s, --rdzv-conf close_timeout)"));
      });
    }
    return code;
  };
  for (bool first = true;; first = false) {
    std::optional<Round> round;
    try {
      round = rdzv.join(waiting);
    } catch (const CommError&) {
      leave(bool(served), 1);
      throw;
    }
    if (!round) {
      console.message("dtorch launch: the job finished while this node waited to join it");
      return leave(bool(served), 0);
    }
    Plan plan = base;
    plan.opts.node_rank = round->node_rank;
    plan.opts.nnodes = round->nnodes;
    plan.world_size = round->nnodes * o.nproc_per_node;
    std::string who;
    for (int i = 0; i < round->nnodes; ++i)
      who += str(i ? ", " : "", "n", i, " ", round->hosts[static_cast<std::size_t>(i)]);
    // A static job's workers meet in node 0's store, as the launchers did.
    c10::intrusive_ptr<c10d::Store> workers_store;
    if (fixed) {
      if (first && o.node_rank == 0)
        console.message(str("dtorch launch: all ", o.nnodes, " nodes arrived (", who, ")"));
    } else {
      workers_store = round_store(plan, *round, rdzv, join_ms, console);
      const int first_rank = round->node_rank * o.nproc_per_node;
      console.message(str("dtorch launch: round ", round->number, ": ", round->nnodes, " node(s) (",
                          who, "); this node is n", round->node_rank, ", ranks ", first_rank, "..",
                          first_rank + o.nproc_per_node - 1, " of ", plan.world_size));
    }
    RankLogs logs(plan.opts, !first);
    // Per round: between rounds a signal ends the launcher at once (its heartbeat stops, and the
    // others count it lost).
    SignalWatch signals(signal_number(o.checkpoint_signal));
    plan.logs = &logs;
    std::optional<RoundEnd> ended;
    bool store_lost = false;
    auto watch = [&]() -> bool {
      if (store_lost) return false;
      try {
        ended = rdzv.poll();
      } catch (const std::exception& e) {
        store_lost = true;
        std::string why = e.what();
        console.message(str("dtorch launch: lost the rendezvous store at ", at.host, ":", at.port,
                            " (", why.substr(0, why.find('\n')),
                            "); the workers go on, but "
                            "this node can no longer restart them"));
      }
      return ended.has_value();
    };
    AttemptEnd end;
    try {
      end = Attempt(plan, round->restarts, console, signals, deadline, watch).run();
    } catch (const SpawnError& e) {
      console.message(str("dtorch launch: ", e.what()));
      return e.exit_code();
    }
    int code = 1;
    switch (end.how) {
      case End::Success:
        rdzv.finish();
        return leave(served || round->node_rank == 0, 0);
      case End::Checkpointed:
        rdzv.finish();
        return leave(served || round->node_rank == 0, checkpointed(plan, console));
      case End::Signalled:
      case End::TimedOut:
        return stopped_by_launcher(end, o, console);
      case End::WorkerFailed: {
        std::string failure = describe_failure(plan, end.failure);
        console.message(failure);
        logs.write(end.failure.local_rank, failure + "\n");
        code = exit_code_of(end.failure.status);
        ended = rdzv.end_round(RoundCause::Failure,
                               str("rank ", end.failure.rank, " on ",
                                   round->hosts[static_cast<std::size_t>(round->node_rank)], " ",
                                   describe_status(end.failure.status)));
        break;
      }
      case End::RoundEnded:
        break;
    }
    if (ended->fail) {
      console.message(str("dtorch launch: the job fails: ", ended->why));
      return leave(bool(served), code);
    }
    if (fixed) {
      console.message(str("dtorch launch: ", ended->why, "; restarting all workers (restart ",
                          round->restarts + 1, " of ", o.max_restarts, ")"));
    } else {
      console.message(str("dtorch launch: round ", round->number, " ends: ", ended->why,
                          "; stopping this node's workers and meeting again"));
    }
  }
}

}  // namespace

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
