// dtorch_test_client TEST_BINARY [ARGS...]: runs the test binary's command line in a fork of
// its test server, starting one when none listens, and exits as the test did (Note [Test
// server] in main.cpp). Exec's the test binary instead under DTORCH_FORK_WORKERS=0 and
// whenever no server answers. Links no LibTorch: it starts in a millisecond.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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
  // The server reads the environment as its libraries load, except ctest's per-test variables
  // (CTEST_RESOURCE_GROUP_*), which every test gets in its request.
  const int server =
      launch::connect_fork_server(test[0], "DTORCH_TEST_SERVER",
                                  launch::fork_server_name("test-server", test[0], env, "CTEST_"));
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
