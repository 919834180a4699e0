// dtorch_test_client TEST_BINARY [ARGS...]: runs the test binary's command line in a fork of
// its test server, starting one when none listens, and exits as the test did (Note [Test
// server] in main.cpp). Exec's the test binary instead under DTORCH_FORK_WORKERS=0 and
// whenever no server answers. Links no LibTorch: it starts in a millisecond.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/launch/fork_requests.h"

namespace {

namespace launch = dtorch::launch;

[[noreturn]] void exec_test(char** test) {
  ::execv(test[0], test);
  std::fprintf(stderr, "dtorch_test_client: cannot run %s: %s\n", test[0], std::strerror(errno));
  ::_exit(127);
}

std::vector<std::string> environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    env.emplace_back(*e);
  return env;
}

// The server's socket name: this user's, for this build of the binary (device, inode, time,
// size) and this environment less ctest's per-test variables (CTEST_RESOURCE_GROUP_*: a server
// read the rest as its libraries loaded). Empty when the binary cannot be looked at.
std::string server_name(const char* binary, const std::vector<std::string>& env) {
  struct stat st;
  if (::stat(binary, &st) != 0) return "";
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, a field at a time
  auto mix = [&](const std::string& field) {
    for (const unsigned char c : field + '\0') {
      hash ^= c;
      hash *= 1099511628211ull;
    }
  };
  mix(binary);
  for (const auto n :
       {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
        static_cast<uint64_t>(st.st_mtim.tv_sec), static_cast<uint64_t>(st.st_mtim.tv_nsec),
        static_cast<uint64_t>(st.st_size)})
    mix(std::to_string(n));
  std::vector<std::string> kept;
  std::copy_if(env.begin(), env.end(), std::back_inserter(kept),
               [](const std::string& e) { return e.rfind("CTEST_", 0) != 0; });
  std::sort(kept.begin(), kept.end());
  for (const auto& e : kept)
    mix(e);
  char name[64];
  std::snprintf(name, sizeof name, "dtorch-test-server-%u-%016llx", ::geteuid(),
                static_cast<unsigned long long>(hash));
  return name;
}

// Starts `binary` as the test server on `name`: in a session of its own, not our child, its
// streams /dev/null (ctest waits for no process that holds them), in "/". Waits until it
// listens or finds the name held, a minute at most.
void start_server(const char* binary, const std::string& name) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    const int null = ::open("/dev/null", O_RDWR);
    if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(null, 1) < 0 || ::dup2(null, 2) < 0 ||
        ::dup2(ready[1], 3) < 0 || ::fcntl(3, F_SETFD, 0) != 0 || ::chdir("/") != 0)
      ::_exit(127);
    ::syscall(SYS_close_range, 4U, ~0U, 0U);
    ::setenv("DTORCH_TEST_SERVER", name.c_str(), 1);
    char* args[] = {const_cast<char*>(binary), nullptr};
    ::execv(binary, args);
    ::_exit(127);
  }
  ::close(ready[1]);
  if (pid > 0) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    char answer;
    if (launch::wire::readable_within(ready[0], 60)) (void)!::read(ready[0], &answer, 1);
  }
  ::close(ready[0]);
}

// Ends this process as the test's status says: its exit code, or the signal that killed it.
[[noreturn]] void end_as(int status) {
  if (WIFEXITED(status)) std::exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const struct rlimit no_core = {0, 0};  // the test's own dumped, if any
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    std::exit(128 + sig);
  }
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: dtorch_test_client TEST_BINARY [ARGS...] (runs a test of dtorch's test "
                 "binary in a fork of its test server)\n");
    return 2;
  }
  char** test = argv + 1;
  const char* forks = std::getenv("DTORCH_FORK_WORKERS");
  if (forks && std::strcmp(forks, "0") == 0) exec_test(test);
  const std::vector<std::string> env = environment();
  const std::string name = server_name(test[0], env);
  if (name.empty()) exec_test(test);
  int server = launch::connect_local(name);
  for (int attempt = 0; server < 0 && attempt < 5; ++attempt) {
    if (attempt == 0) {
      start_server(test[0], name);
    } else {
      ::usleep(100 * 1000);  // the server that holds the name has yet to listen
    }
    server = launch::connect_local(name);
  }
  if (server < 0) exec_test(test);
  const int dir = ::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::optional<launch::ServedFork> fork;
  if (dir >= 0) fork = launch::request_fork(server, {test, argv + argc}, env, dir, {0, 1, 2});
  ::close(server);
  if (dir >= 0) ::close(dir);
  if (!fork) exec_test(test);
  try {
    for (;;)
      if (auto status = launch::wait_served(*fork, 3600)) end_as(*status);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtorch_test_client: %s\n", e.what());
    return 1;
  }
}
