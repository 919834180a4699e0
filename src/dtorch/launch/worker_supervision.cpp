// Worker supervision (worker_supervision.h): starts a node's workers with torchrun's environment,
// relays their output line by line with "[n<node> r<rank>] " in front, and tears the group down
// as soon as one worker fails, is signalled or runs out of time.
#include "dtorch/launch/worker_supervision.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/launch/line_prefixer.h"
#include "dtorch/launch/process.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A hidden rank's (--show-ranks) recent stderr, printed if it fails, so its error is not lost.
constexpr std::size_t kHiddenTailBytes = 4096;
// How much a worker may still have in its pipes when it exits; more is a grandchild's.
constexpr std::size_t kExitDrainBytes = 4 << 20;

// torchrun's TORCHELASTIC_ERROR_FILE: a program whose entry point PyTorch's @record wraps writes
// its exception there, and the launcher shows it when the worker fails.
std::string error_file(const Plan& plan, int attempt, int local_rank) {
  return str(plan.error_dir, "/attempt_", attempt, "/", local_rank, "/error.json");
}

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
      w.child = spawn(SpawnRequest{plan_.program_path, o.command, worker_env(plan_, lr, attempt_),
                                   plan_.forks});
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

}  // namespace

AttemptEnd run_attempt(const Plan& plan, int attempt, Console& console, SignalWatch& signals,
                       std::optional<Clock::time_point> deadline, std::function<bool()> watch) {
  return Attempt(plan, attempt, console, signals, deadline, std::move(watch)).run();
}

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

}  // namespace dtorch::launch
