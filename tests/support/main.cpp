// Test binary entry point: a test server, a worker process of a multi-rank test, or gtest.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtorch/launch/process.h"
#include "support/workers.h"

namespace {

// `dtorch_tests --probe-test-server HOW`, which ForkServer.TheTestClient* run (Note [Test
// server]): prints its pid, directory and $PROBE_VALUE, then exits with code HOW, or raises
// SIGTERM (HOW "signal"), or sleeps a minute ("sleep").
int probe(const std::string& how) {
  char dir[4096] = "?";
  (void)!::getcwd(dir, sizeof dir);
  const char* value = std::getenv("PROBE_VALUE");
  std::printf("pid=%d dir=%s value=%s\n", ::getpid(), dir, value ? value : "");
  std::fflush(stdout);
  if (how == "signal") ::raise(SIGTERM);
  if (how == "sleep") ::sleep(60);
  return std::atoi(how.c_str());
}

int run_tests(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--probe-test-server") return probe(argv[2]);
  int rc = dtorch::testing::maybe_run_worker(argc, argv);
  if (rc >= 0) return rc;
  torch::set_num_threads(1);  // ctest runs tests side by side on few cores
  // Note [Forked workers]: the ranks of multi-rank tests, and the workers of the command lines
  // tests run (with --nproc-per-node, or `dtorch launch -- dtorch ...`), are forks rather than
  // new processes (a launcher exec's any other program; DTORCH_FORK_WORKERS=0 exec's them
  // all, and the command lines too: Note [Fork server]).
  ::setenv("DTORCH_FORK_WORKERS", "1", 0);
  dtorch::testing::start_rank_server();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace

// Note [Test server]
// ctest starts this binary once per ctest test, over three hundred times a run, and each start
// costs about half a second of CPU before main() (Note [Forked workers]). So ctest runs every
// test through dtorch_test_client (tests/support/test_client.cpp, the binary's
// CROSSCOMPILING_EMULATOR, which ctest and gtest_discover_tests put before its command lines):
// the client asks a fork server of this binary (Note [Fork server]) to run the command line,
// and exits as the test did. When none listens, the client starts one: this binary with
// DTORCH_TEST_SERVER naming its socket, in a session of its own and with no stream of the
// client's, so that ctest waits for none of it; it ends once idle for ten seconds. The name
// is made of the binary's file identity and the environment less ctest's per-test variables:
// a rebuilt binary, or another environment, gets a server of its own. A test runs as an exec'd
// one would but for its parent (the server), /proc/self/cmdline and its resident set (the
// server's code pages count once touched again: support/resident.h); a client killed (ctest's
// timeout) takes its test with it. Under DTORCH_FORK_WORKERS=0 (make test SANITIZE=1) the
// client exec's every test, and it exec's whenever no server answers.
int main(int argc, char** argv) {
  try {
    dtorch::launch::serve_forks_when_asked("DTORCH_TEST_SERVER",
                                           dtorch::launch::forked_main_of(run_tests), 10);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtorch_tests: %s\n", e.what());
    return 1;
  }
  return run_tests(argc, argv);
}
