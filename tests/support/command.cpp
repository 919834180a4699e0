// Program runner for command-line tests (see command.h).
#include "support/command.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "dtorch/core/env.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/fork_requests.h"
#include "dtorch/launch/process.h"
#include "support/workers.h"

namespace dtorch::testing {

using Clock = std::chrono::steady_clock;

int CommandResult::exit_code() const {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

Command start_launch(const std::string& dir, std::vector<std::string> args,
                     const std::vector<std::string>& env) {
  args.insert(args.begin(), {DTORCH_CLI, "launch"});
  return start_command(dir, args, env);
}

CommandResult run_launch(const std::string& name, const std::vector<std::string>& args,
                         double limit) {
  return finish_command(start_launch(scratch_dir(name), args), limit);
}

bool wait_until(const std::function<bool()>& ready, double limit) {
  auto deadline = Clock::now() + std::chrono::duration<double>(limit);
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ready();
}

bool wait_for_file(const std::string& path, double limit) {
  return wait_until([&] { return paths::exists(path); }, limit);
}

bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

bool listening(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

namespace {

// This process's environment with `env` applied as putenv would ("NAME" alone removes NAME).
std::vector<std::string> environment_with(const std::vector<std::string>& env) {
  std::vector<std::string> all;
  for (char** e = environ; *e; ++e)
    all.emplace_back(*e);
  for (const auto& kv : env) {
    const auto eq = kv.find('=');
    const std::string name = kv.substr(0, eq) + "=";
    all.erase(std::remove_if(all.begin(), all.end(),
                             [&](const std::string& e) { return e.rfind(name, 0) == 0; }),
              all.end());
    if (eq != std::string::npos) all.push_back(kv);
  }
  return all;
}

// Note [Fork server]: a connection to the `dtorch` that the command lines of every test of
// this build (in this environment, less ctest's per-test variables) are forks of; -1 when
// there is none (then they are exec'd).
int cli_server() {
  if (env::get("DTORCH_FORK_WORKERS") != std::optional<std::string>("1")) return -1;
  return launch::connect_fork_server(
      DTORCH_CLI, "DTORCH_FORK_SERVER",
      launch::fork_server_name("cli-server", DTORCH_CLI, environment_with({}), "CTEST_"));
}

// start_command for `dtorch`, from the fork server; none when there is none (then exec).
std::optional<Command> start_served(const std::string& dir, const std::vector<std::string>& args,
                                    const std::vector<std::string>& env, const std::string& cwd) {
  const int server = cli_server();
  if (server < 0) return std::nullopt;
  const std::string out = dir + "/stdout", err = dir + "/stderr";
  std::array<int, 4> fds = {
      ::open("/dev/null", O_RDONLY | O_CLOEXEC),
      ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
      ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
      ::open(cwd.empty() ? "." : cwd.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  Command c{-1, dir, Clock::now()};
  std::optional<launch::ServedFork> fork;
  if (std::all_of(fds.begin(), fds.end(), [](int fd) { return fd >= 0; })) {
    fork =
        launch::request_fork(server, args, environment_with(env), fds[3], {fds[0], fds[1], fds[2]});
  }
  ::close(server);
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  if (!fork) return std::nullopt;
  c.pid = fork->pid;
  c.status_fd = fork->status_fd;
  return c;
}

}  // namespace

Command start_command(const std::string& dir, const std::vector<std::string>& args,
                      const std::vector<std::string>& env, const std::string& cwd) {
  if (!args.empty() && args[0] == DTORCH_CLI) {
    if (auto served = start_served(dir, args, env, cwd)) return *served;
  }
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a)
    argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> e = env;
  std::string out = dir + "/stdout", err = dir + "/stderr";
  Command c{-1, dir, Clock::now()};
  c.pid = ::fork();
  if (c.pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int f = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || f < 0 || in < 0 || ::dup2(o, 1) < 0 || ::dup2(f, 2) < 0 || ::dup2(in, 0) < 0) {
      ::_exit(126);
    }
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    for (auto& kv : e)
      ::putenv(kv.data());
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return c;
}

CommandResult finish_command(const Command& c, double limit) {
  CommandResult r;
  if (c.status_fd >= 0) {
    const launch::ServedFork fork{c.pid, c.status_fd};
    auto status = launch::wait_served(fork, limit - seconds_since(c.started));
    if (!status) {
      ::kill(c.pid, SIGKILL);
      status = launch::wait_served(fork, 30);
      ADD_FAILURE() << "the command did not end within " << limit << " s";
    }
    ::close(c.status_fd);
    r.status = status.value_or(-1);
  }
  auto deadline = c.started + std::chrono::duration<double>(limit);
  while (c.status_fd < 0 && ::waitpid(c.pid, &r.status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &r.status, 0);
      ADD_FAILURE() << "the command did not end within " << limit << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - c.started).count();
  r.out = read_file(c.dir + "/stdout");
  r.err = read_file(c.dir + "/stderr");
  return r;
}

CommandResult run_command(const std::string& name, const std::vector<std::string>& argv,
                          double limit, const std::vector<std::string>& env) {
  return finish_command(start_command(scratch_dir(name), argv, env), limit);
}

CommandResult run_second_worker(const std::string& name, int port, double limit,
                                const std::vector<std::string>& env) {
  std::vector<std::string> all = {"RANK=1",
                                  "LOCAL_RANK=1",
                                  "WORLD_SIZE=2",
                                  "LOCAL_WORLD_SIZE=2",
                                  "GROUP_RANK=0",
                                  "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + std::to_string(port),
                                  "TORCHELASTIC_USE_AGENT_STORE=True"};
  all.insert(all.end(), env.begin(), env.end());
  const std::string dir = scratch_dir(name);
  return finish_command(start_command(dir,
                                      {DTORCH_CLI, "train", "--model", "mnist-mlp", "--epochs", "1",
                                       "--train-samples", "64", "--out", dir + "/run"},
                                      all),
                        limit);
}

}  // namespace dtorch::testing
