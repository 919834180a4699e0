// Worker processes: fork/exec, process groups, parent-death signal, and wait statuses in words.
// The launcher runs inside a multi-threaded process (LibTorch's pools, the store's server), so
// the child does only async-signal-safe calls between fork and exec; a forked worker comes from
// a fork made ahead, while the launcher had no busy thread (Note [Forked workers]).
#include "dtorch/launch/process.h"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "dtorch/core/env.h"
#include "dtorch/launch/fork_requests.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace dtorch::launch {
namespace {

// 0 when `path` is an executable file, else the errno that exec would give.
int check_executable(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (::access(path.c_str(), X_OK) != 0) return errno;
  return 0;
}

std::string cannot_run(const std::string& program, int err) {
  std::string msg = "cannot run " + program + ": " + std::strerror(err);
  if (err == ENOENT && program.find('/') == std::string::npos) {
    msg += " (not found on PATH; give its path, e.g. ./" + program + ", or fix PATH)";
  } else if (err == ENOENT) {
    msg += " (check the path; it is relative to the current directory)";
  } else if (err == EACCES) {
    msg += " (make it executable: chmod +x " + program + ")";
  }
  return msg;
}

SpawnError spawn_error(const std::string& program, int err) {
  return SpawnError(cannot_run(program, err), err == ENOENT ? 127 : 126);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// One past the highest descriptor number this process may have. Async-signal-safe.
long fd_limit() {
  struct rlimit rl;
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
             ? static_cast<long>(rl.rlim_cur)
             : 65536;
}

// Marks every descriptor from 3 up close-on-exec, so a worker inherits none of the launcher's
// sockets (the store's listening socket above all). Async-signal-safe.
void cloexec_from_3() {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (long fd = 3, end = fd_limit(); fd < end; ++fd)
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

// Closes every descriptor from `first` up: a forked worker's, which no exec will close.
void close_from(unsigned first) {
  if (::syscall(SYS_close_range, first, ~0U, 0U) == 0) return;
  for (long fd = first, end = fd_limit(); fd < end; ++fd)
    ::close(static_cast<int>(fd));
}

// A new child's first steps: own process group, parent-death signal, default signal
// dispositions and none blocked. Async-signal-safe.
void become_own_group(pid_t parent) {
  ::setpgid(0, 0);
  // The parent may have died between fork and prctl; then nobody would ever kill us.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s)
    ::sigaction(s, &dfl, nullptr);  // fails harmlessly for some
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// The child's side of spawn() up to exec: become_own_group, and stdin/stdout/stderr in place.
// Async-signal-safe; false (with errno written to status_fd) when a descriptor could not be set.
bool child_setup(pid_t parent, int in_fd, int out_fd, int err_fd, int status_fd) {
  become_own_group(parent);
  if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) {
    int e = errno;
    (void)!::write(status_fd, &e, sizeof e);
    return false;
  }
  return true;
}

[[noreturn]] void child_exec(const char* path, char* const argv[], char* const envp[], pid_t parent,
                             int in_fd, int out_fd, int err_fd, int status_fd) {
  if (!child_setup(parent, in_fd, out_fd, err_fd, status_fd)) ::_exit(127);
  cloexec_from_3();
  ::execve(path, argv, envp);
  int e = errno;
  (void)!::write(status_fd, &e, sizeof e);  // tells the parent why; closes on exec otherwise
  ::_exit(127);
}

// A worker's standard streams: stdin from /dev/null, stdout and stderr into pipes whose read
// ends the launcher keeps.
struct StdStreams {
  int in = -1;
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};

  void close_childs() {
    for (int* fd : {&in, &out[1], &err[1]})
      close_fd(*fd);
  }
  void close_ours() {
    for (int* fd : {&out[0], &err[0]})
      close_fd(*fd);
  }
  // Our ends, as the worker `pid`'s, read without blocking.
  Child child(pid_t pid) const {
    for (int fd : {out[0], err[0]})
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return Child{pid, out[0], err[0]};
  }
};

[[noreturn]] void out_of_descriptors(int err) {
  throw Error(str("cannot start a worker: out of file descriptors (", std::strerror(err),
                  "); raise `ulimit -n` or start fewer workers"));
}

[[noreturn]] void fork_failed(int err) {
  throw Error(str("cannot start a worker: fork failed (", std::strerror(err),
                  "); the machine may be out of memory or processes (ulimit -u)"));
}

StdStreams open_streams() {
  StdStreams s;
  s.in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (s.in < 0 || ::pipe2(s.out, O_CLOEXEC) != 0 || ::pipe2(s.err, O_CLOEXEC) != 0) {
    const int e = errno;
    s.close_childs();
    s.close_ours();
    out_of_descriptors(e);
  }
  return s;
}

// Every signal blocked while it lives (or until restore()): across a fork, so that the child
// cannot run the launcher's handlers before it has reset them to their defaults.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~BlockSignals() { restore(); }
  BlockSignals(const BlockSignals&) = delete;
  BlockSignals& operator=(const BlockSignals&) = delete;
  void restore() {
    if (restored_) return;
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    restored_ = true;
  }

 private:
  sigset_t old_;
  bool restored_ = false;
};

// A forked process's last steps before it runs the request's command line: its standard
// streams in place, no other descriptor, the request's environment. Then main(argv), and an
// exit without static destructors: they belong to the process this one is a copy of.
[[noreturn]] void run_forked(const ForkedMain& main, const std::string& request,
                             const std::array<int, 3>& streams) {
  if (::dup2(streams[0], 0) < 0 || ::dup2(streams[1], 1) < 0 || ::dup2(streams[2], 2) < 0)
    ::_exit(127);
  close_from(3);
  std::vector<std::string> argv, env;
  if (!wire::decode_request(request, argv, env)) ::_exit(127);
  take_environment(std::move(env));
  int rc = 1;
  try {
    // OpenMP read OMP_NUM_THREADS when the process forked loaded it; an exec'd one reads its own.
    if (auto threads = env::get_int("OMP_NUM_THREADS"); threads && *threads > 0)
      at::set_num_threads(static_cast<int>(*threads));
    rc = main(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  std::fflush(nullptr);
  ::_exit(rc);
}

// A waiting fork's life (Note [Forked workers]): its own group, the launcher's descriptors
// closed but for its socket, then its request: the worker's streams, environment and argv,
// and the worker's main. Ends at once when the launcher needs no worker of it.
[[noreturn]] void wait_to_work(int sock, pid_t parent, const ForkedMain& main) {
  become_own_group(parent);
  if (sock != 3 && ::dup2(sock, 3) < 0) ::_exit(127);
  close_from(4);
  std::string request;
  std::array<int, 3> fds{};
  if (!wire::receive_request(3, request, fds.data(), fds.size())) ::_exit(0);
  run_forked(main, request, fds);
}

// A waiting fork no worker will use: told (its socket closed), killed and reaped.
void end_waiting(pid_t pid, int fd) {
  ::close(fd);
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (int e = check_executable(program)) throw spawn_error(program, e);
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int err = ENOENT;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    int e = check_executable(candidate);
    if (e == 0) return candidate;
    if (e != ENOENT && e != ENOTDIR) err = e;  // like execvp: report EACCES over "not found"
    start = end + 1;
  }
  throw spawn_error(program, err);
}

Child spawn(const SpawnRequest& req) {
  if (req.forks) {
    if (auto child = req.forks->start(req)) return *child;
  }
  // Everything the child touches is built before fork: another thread may hold malloc's lock.
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  StdStreams s = open_streams();
  int status[2] = {-1, -1};
  if (::pipe2(status, O_CLOEXEC) != 0) {
    const int e = errno;
    s.close_childs();
    s.close_ours();
    out_of_descriptors(e);
  }

  BlockSignals blocked;
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    child_exec(req.path.c_str(), argv.data(), envp.data(), parent, s.in, s.out[1], s.err[1],
               status[1]);
  }
  int fork_errno = errno;
  blocked.restore();
  s.close_childs();
  close_fd(status[1]);
  if (pid < 0) {
    s.close_ours();
    close_fd(status[0]);
    fork_failed(fork_errno);
  }
  ::setpgid(pid, pid);  // also here, so a teardown right after spawn already reaches the group

  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close_fd(status[0]);
  if (n > 0) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    s.close_ours();
    throw spawn_error(req.argv.empty() ? req.path : req.argv[0], exec_errno);
  }
  return s.child(pid);
}

// ---- Note [Forked workers]: forks that wait to become workers -------------------------------

WorkerForks::WorkerForks(int n, ForkedMain main) {
  for (int i = 0; i < n; ++i) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    BlockSignals blocked;
    const pid_t parent = ::getpid();
    std::fflush(nullptr);  // else the worker would write our buffers again
    const pid_t pid = ::fork();
    if (pid == 0) wait_to_work(sv[1], parent, main);
    blocked.restore();
    ::close(sv[1]);
    if (pid < 0) {
      ::close(sv[0]);
      return;
    }
    ::setpgid(pid, pid);
    waiting_.push_back({pid, sv[0]});
  }
}

WorkerForks::~WorkerForks() {
  for (Waiting& w : waiting_)
    end_waiting(w.pid, w.fd);
}

std::optional<Child> WorkerForks::start(const SpawnRequest& req) {
  const std::string request = wire::encode_request(req.argv, req.env);
  while (!waiting_.empty()) {
    StdStreams s = open_streams();  // first: when it throws, the fork stays ours to reap
    const Waiting w = waiting_.front();
    waiting_.erase(waiting_.begin());
    const int fds[3] = {s.in, s.out[1], s.err[1]};
    const bool sent = wire::send_request(w.fd, request, fds, 3);
    s.close_childs();
    if (sent) {
      ::close(w.fd);
      return s.child(w.pid);
    }
    s.close_ours();
    end_waiting(w.pid, w.fd);  // killed from outside, say: the next one, or an exec
  }
  return std::nullopt;
}

// ---- Note [Fork server]: a fresh process that forks on request ------------------------------

namespace {

// The next request from a connection to `listener` into `request` and `fds`: false when there
// is none to serve now.
bool next_request(int listener, std::string& request, std::array<int, 5>& fds) {
  const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0) return false;
  // A client that connects and says nothing holds the server up for ten seconds at most.
  const struct timeval limit = {10, 0};
  const bool served = peer_is_this_user(conn) &&
                      ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0 &&
                      wire::receive_request(conn, request, fds.data(), fds.size());
  ::close(conn);
  return served;
}

// Note [Fork server]'s loop. Children are reaped as they end (SIGCHLD, read from a descriptor),
// requests served as they come; each request's answer socket gets its fork's pid, then its wait
// status. A fork whose client closed that socket first (killed, say) is killed: nobody waits
// for it any more.
[[noreturn]] void serve(int listener, const ForkedMain& main, double idle_seconds) {
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, &old);
  const int children = ::signalfd(-1, &chld, SFD_CLOEXEC);
  if (children < 0) ::_exit(127);
  std::map<pid_t, int> answers;  // -1 once its client is gone
  for (;;) {
    std::vector<struct pollfd> p = {{listener, POLLIN, 0}, {children, POLLIN, 0}};
    std::vector<pid_t> watched;
    for (const auto& [pid, fd] : answers) {
      if (fd < 0) continue;
      p.push_back({fd, 0, 0});  // POLLHUP, always reported: the client closed its end
      watched.push_back(pid);
    }
    const int idle = answers.empty() ? static_cast<int>(idle_seconds * 1000) : -1;
    const int ready = ::poll(p.data(), p.size(), idle);
    if (ready == 0) ::_exit(0);
    if (ready < 0) {
      if (errno == EINTR) continue;
      ::_exit(127);
    }
    for (std::size_t i = 0; i < watched.size(); ++i) {
      if (!(p[i + 2].revents & (POLLHUP | POLLERR))) continue;
      ::kill(watched[i], SIGKILL);
      ::close(p[i + 2].fd);
      answers[watched[i]] = -1;
    }
    if (p[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      (void)!::read(children, &info, sizeof info);
      int status;
      for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
        auto it = answers.find(pid);
        if (it == answers.end()) continue;
        if (it->second >= 0) {
          wire::write_all(it->second, reinterpret_cast<const char*>(&status), sizeof status);
          ::close(it->second);
        }
        answers.erase(it);
      }
    }
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    std::string request;
    std::array<int, 5> fds{};  // stdin, stdout, stderr, working directory, answer
    if (!next_request(listener, request, fds)) continue;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      if (::fchdir(fds[3]) != 0) ::_exit(127);
      run_forked(main, request, {fds[0], fds[1], fds[2]});
    }
    for (int i = 0; i < 4; ++i)
      ::close(fds[i]);
    if (pid < 0 || !wire::write_all(fds[4], reinterpret_cast<const char*>(&pid), sizeof pid)) {
      ::close(fds[4]);  // the client reads an end instead of a pid
      continue;
    }
    answers[pid] = fds[4];
  }
}

}  // namespace

void serve_forks_when_asked(const char* variable, const ForkedMain& main, double idle_seconds) {
  const char* value = std::getenv(variable);
  if (!value) return;
  const std::string name = value;
  ::unsetenv(variable);
  // The process that started us waits on descriptor 3 for a word: listening, or the name held
  // by another server (then it asks that one).
  struct stat ready;
  if (name.empty() || ::fstat(3, &ready) != 0 || !S_ISFIFO(ready.st_mode))
    throw ConfigError(str(variable, "=", name, " asks for a fork server of dtorch's test suite, ",
                          "but this process was not started as one; unset ", variable));
  const int listener = listen_local(name);
  const char answer = listener >= 0 ? 'L' : 'H';
  (void)!::write(3, &answer, 1);
  ::close(3);
  if (listener < 0) ::_exit(0);
  serve(listener, main, idle_seconds);
}

ForkedMain forked_main_of(int (*main)(int argc, char** argv)) {
  return [main](const std::vector<std::string>& argv) {
    std::vector<std::string> args = argv;  // main may change them
    std::vector<char*> ptrs;
    for (auto& a : args)
      ptrs.push_back(a.data());
    ptrs.push_back(nullptr);
    return main(static_cast<int>(args.size()), ptrs.data());
  };
}

void take_environment(std::vector<std::string> env) {
  // environ points into these until the process ends.
  static std::vector<std::string> strings;
  static std::vector<char*> pointers;
  strings = std::move(env);
  pointers.clear();
  for (auto& e : strings)
    pointers.push_back(e.data());
  pointers.push_back(nullptr);
  environ = pointers.data();
}

void signal_group(pid_t pgid, int sig) {
  if (pgid > 0) ::kill(-pgid, sig);
}

bool is_stopped(pid_t pid) {
  // "pid (comm) S ...": the state follows the last ')', as comm may hold any character.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string fields((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = fields.rfind(')');
  return close != std::string::npos && close + 2 < fields.size() && fields[close + 2] == 'T';
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string s = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
    if (WCOREDUMP(status)) s += " and dumped core";
    return s;
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace dtorch::launch
