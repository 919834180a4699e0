// Worker registry and rank runner for multi-rank tests (see workers.h).
#include "support/workers.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "dtorch/core/env.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/launch/process.h"

namespace dtorch::testing {

// The rank server (Note [Forked workers]): the binary forks it at the start of main(), before
// any test ran or any thread exists. run_ranks() sends it the request (worker, ranks,
// arguments, the test's environment and working directory); it forks a launcher, which runs
// launch::run as before but forks each worker from itself (LaunchOptions::forked_main) rather
// than exec'ing this binary again, and answers with the launcher's exit code. The launcher dies
// with the server, the server with the test. DTORCH_TEST_EXEC_RANKS=1 exec's the ranks instead.

namespace {

std::map<std::string, WorkerFn>& registry() {
  static std::map<std::string, WorkerFn> r;
  return r;
}

std::string self_exe() {
  return paths::executable_path();
}

int run_worker(const std::vector<std::string>& argv) {
  if (argv.size() < 3 || argv[1] != "--dtorch-worker") return 2;
  auto it = registry().find(argv[2]);
  if (it == registry().end()) {
    std::cerr << "no test worker named " << argv[2] << "\n";
    return 2;
  }
  try {
    it->second(std::vector<std::string>(argv.begin() + 3, argv.end()));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "worker " << argv[2] << " failed: " << e.what() << "\n";
    return 1;
  }
}

launch::LaunchOptions launch_options(int n, const std::string& name,
                                     const std::vector<std::string>& args, double timeout_seconds) {
  launch::LaunchOptions o;
  o.nproc_per_node = n;
  o.standalone = true;
  o.timeout_seconds = timeout_seconds;
  o.command = {self_exe(), "--dtorch-worker", name};
  o.command.insert(o.command.end(), args.begin(), args.end());
  o.env["OMP_NUM_THREADS"] = "1";
  return o;
}

// The request and the answer travel as strings of one datagram each (SOCK_SEQPACKET): fields
// separated by '\0', lists prefixed by their length.
struct Request {
  int n = 0;
  double timeout_seconds = 0;
  std::string name, cwd;
  std::vector<std::string> args, env;
};

void put(std::string& out, const std::string& field) {
  out += field;
  out += '\0';
}

void put_list(std::string& out, const std::vector<std::string>& list) {
  put(out, std::to_string(list.size()));
  for (const auto& s : list)
    put(out, s);
}

std::string encode(const Request& r) {
  std::string out;
  put(out, std::to_string(r.n));
  put(out, std::to_string(r.timeout_seconds));
  put(out, r.name);
  put(out, r.cwd);
  put_list(out, r.args);
  put_list(out, r.env);
  return out;
}

Request decode(const std::string& in) {
  std::size_t at = 0;
  auto next = [&] {
    std::size_t end = in.find('\0', at);
    if (end == std::string::npos) throw std::runtime_error("rank server: truncated request");
    std::string field = in.substr(at, end - at);
    at = end + 1;
    return field;
  };
  auto next_list = [&] {
    std::vector<std::string> list(std::stoul(next()));
    for (auto& s : list)
      s = next();
    return list;
  };
  Request r;
  r.n = std::stoi(next());
  r.timeout_seconds = std::stod(next());
  r.name = next();
  r.cwd = next();
  r.args = next_list();
  r.env = next_list();
  return r;
}

// The launcher, in a fork of the rank server: the test's environment and directory, then the
// ranks, forked from here.
[[noreturn]] void run_launcher(const Request& r, int server_fd) {
  ::close(server_fd);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  launch::take_environment(r.env);
  int rc = 1;
  try {
    if (!r.cwd.empty() && ::chdir(r.cwd.c_str()) != 0)
      throw std::runtime_error("cannot enter " + r.cwd + ": " + std::strerror(errno));
    launch::LaunchOptions o = launch_options(r.n, r.name, r.args, r.timeout_seconds);
    o.forked_main = run_worker;
    rc = launch::run(o);
  } catch (const std::exception& e) {
    std::cerr << "run_ranks: " << e.what() << "\n";
  }
  std::fflush(nullptr);
  ::_exit(rc);
}

// The rank server's loop: one request at a time, answered with the launcher's exit code (or
// 128 + the signal that killed it). Ends when the test closes its end.
[[noreturn]] void serve(int fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t got = ::recv(fd, buf.data(), buf.size(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) ::_exit(0);
    int answer = 1;
    try {
      Request r = decode(buf.substr(0, static_cast<std::size_t>(got)));
      std::fflush(nullptr);
      pid_t pid = ::fork();
      if (pid == 0) run_launcher(r, fd);
      int st = 0;
      while (pid > 0 && ::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      answer = pid < 0 ? 1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
    }
    (void)!::send(fd, &answer, sizeof answer, MSG_NOSIGNAL);
  }
}

int& server_fd() {
  static int fd = -1;
  return fd;
}

int run_on_server(const Request& r) {
  static std::mutex one_at_a_time;  // one socket: requests from two threads would cross
  std::lock_guard<std::mutex> lock(one_at_a_time);
  const std::string msg = encode(r);
  if (::send(server_fd(), msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size()))
    throw std::runtime_error(std::string("rank server: cannot send the request: ") +
                             std::strerror(errno));
  // The launcher ends the ranks at r.timeout_seconds; a minute more is for its teardown.
  const double limit = r.timeout_seconds + 60;
  struct pollfd p {
    server_fd(), POLLIN, 0
  };
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(limit * 1000));
  } while (ready < 0 && errno == EINTR);
  int answer = -1;
  if (ready != 1 || ::recv(server_fd(), &answer, sizeof answer, 0) != sizeof answer)
    throw std::runtime_error("rank server: no answer within " + std::to_string(limit) + " s for " +
                             r.name);
  return answer;
}

}  // namespace

bool register_worker(const std::string& name, WorkerFn fn) {
  registry()[name] = std::move(fn);
  return true;
}

int maybe_run_worker(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "--dtorch-worker") return -1;
  return run_worker(std::vector<std::string>(argv, argv + argc));
}

void start_rank_server() {
  if (env::get("DTORCH_TEST_EXEC_RANKS") == std::optional<std::string>("1")) return;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    serve(fds[1]);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return;
  }
  server_fd() = fds[0];
}

int run_ranks(int n, const std::string& name, const std::vector<std::string>& args,
              double timeout_seconds) {
  if (!(timeout_seconds > 0))
    throw std::invalid_argument("run_ranks(" + name + "): timeout_seconds is " +
                                std::to_string(timeout_seconds) + "; give the test a bound");
  if (server_fd() < 0) return launch::run(launch_options(n, name, args, timeout_seconds));
  Request r;
  r.n = n;
  r.timeout_seconds = timeout_seconds;
  r.name = name;
  r.args = args;
  for (char** e = environ; *e; ++e)
    r.env.emplace_back(*e);
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) r.cwd = cwd;
  return run_on_server(r);
}

std::string scratch_dir(const std::string& name) {
  const std::string p =
      paths::join(DTORCH_BINARY_DIR, "test-scratch", name + "-" + std::to_string(getpid()));
  paths::remove_all(p);
  paths::create_directories(p);
  return p;
}

}  // namespace dtorch::testing
