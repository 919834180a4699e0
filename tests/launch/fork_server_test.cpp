// Note [Fork server]: the `dtorch` command lines the tests run are forks of one `dtorch` that
// serves every test of a build; each must run as an exec'd `dtorch` would: in its directory,
// with its environment and streams, and with its own exit status or the signal that killed it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dtorch/core/env.h"
#include "dtorch/core/paths.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using testing::contains;

bool served_here() {
  return env::get("DTORCH_FORK_WORKERS") == std::optional<std::string>("1");
}

// `dtorch launch` of one worker that prints its directory and a variable, writes to stderr and
// exits with `code`.
std::vector<std::string> launch_sh(int code) {
  return {
      DTORCH_CLI,
      "launch",
      "--standalone",
      "--nproc-per-node",
      "1",
      "--",
      "sh",
      "-c",
      "pwd; echo \"value=$FORK_SERVER_TEST\"; echo on-stderr >&2; exit " + std::to_string(code)};
}

TEST(ForkServer, CommandLinesRunAsExecdOnesDoEvenTwoAtOnce) {
  const std::string dir = testing::scratch_dir("fork-server");
  const std::string work = dir + "/work";
  paths::create_directories(work);
  for (const std::string how : {"served", "execd"}) {
    paths::create_directories(dir + "/" + how + "3");
    paths::create_directories(dir + "/" + how + "4");
    // /usr/bin/env in front: the test binary exec's what is not `dtorch` itself.
    auto argv = [&](int code) {
      std::vector<std::string> a = launch_sh(code);
      if (how == "execd") a.insert(a.begin(), "/usr/bin/env");
      return a;
    };
    const auto three = testing::start_command(dir + "/" + how + "3", argv(3),
                                              {"FORK_SERVER_TEST=" + how + "3"}, work);
    const auto four = testing::start_command(dir + "/" + how + "4", argv(4),
                                             {"FORK_SERVER_TEST=" + how + "4"}, work);
    if (how == "served" && served_here()) {
      EXPECT_GE(three.status_fd, 0);
      EXPECT_GE(four.status_fd, 0);
    }
    // The second one's status first: each answer reaches the command it belongs to.
    const auto r4 = testing::finish_command(four, 30), r3 = testing::finish_command(three, 30);
    for (const auto& [r, code] : {std::pair{r3, 3}, std::pair{r4, 4}}) {
      EXPECT_EQ(r.exit_code(), code) << how << "\n" << r.err;
      EXPECT_TRUE(contains(r.out, work)) << how << "\n" << r.out;
      EXPECT_TRUE(contains(r.out, "value=" + how + std::to_string(code))) << how << "\n" << r.out;
      EXPECT_TRUE(contains(r.err, "on-stderr")) << how << "\n" << r.err;
    }
  }
}

TEST(ForkServer, AKilledCommandLineEndsWithTheSignalAndItsWorkers) {
  const std::string dir = testing::scratch_dir("fork-server-killed");
  const auto c = testing::start_command(
      dir, {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node", "1", "--", "sh", "-c",
            "echo $$ > " + dir + "/worker.pid; exec sleep 60"});
  ASSERT_TRUE(
      testing::wait_until([&] { return !testing::read_file(dir + "/worker.pid").empty(); }, 20))
      << testing::read_file(dir + "/stderr");
  const pid_t worker = std::stoi(testing::read_file(dir + "/worker.pid"));
  ASSERT_EQ(::kill(c.pid, SIGKILL), 0);
  const auto r = testing::finish_command(c, 20);
  ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status;
  EXPECT_EQ(WTERMSIG(r.status), SIGKILL);
  // The launcher's worker dies with it (its parent-death signal), served or not.
  EXPECT_TRUE(testing::wait_until([&] { return !testing::alive(worker); }, 10));
}

TEST(ForkServer, ACommandLineWhoseClientLeavesIsKilled) {
  if (!served_here()) GTEST_SKIP() << "DTORCH_FORK_WORKERS=0: command lines are exec'd";
  const std::string dir = testing::scratch_dir("fork-server-left");
  const auto c = testing::start_command(
      dir, {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node", "1", "--", "sh", "-c",
            "echo $$ > " + dir + "/worker.pid; exec sleep 60"});
  ASSERT_GE(c.status_fd, 0);
  ASSERT_TRUE(
      testing::wait_until([&] { return !testing::read_file(dir + "/worker.pid").empty(); }, 20))
      << testing::read_file(dir + "/stderr");
  const pid_t worker = std::stoi(testing::read_file(dir + "/worker.pid"));
  ::close(c.status_fd);  // as a test binary that dies does
  // The server's child: gone once the server killed and reaped it; its worker with it.
  EXPECT_TRUE(testing::wait_until([&] { return !testing::alive(c.pid); }, 10));
  EXPECT_TRUE(testing::wait_until([&] { return !testing::alive(worker); }, 10));
}

pid_t parent_of(pid_t pid) {
  const std::string stat = testing::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');  // "pid (comm) state ppid ..."
  return close == std::string::npos ? -1 : std::atoi(stat.c_str() + close + 4);
}

// One server for the command lines of every test: started by the first, not a child of the
// test that did (a session of its own), and there for the next command line.
TEST(ForkServer, CommandLinesOfEveryTestAreForksOfOneServer) {
  if (!served_here()) GTEST_SKIP() << "DTORCH_FORK_WORKERS=0: command lines are exec'd";
  std::vector<pid_t> servers;
  for (const std::string name : {"fork-server-one", "fork-server-next"}) {
    const std::string dir = testing::scratch_dir(name);
    const auto c = testing::start_command(
        dir, {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node", "1", "--", "sh", "-c",
              "until [ -e " + dir + "/go ]; do sleep 0.05; done"});
    servers.push_back(parent_of(c.pid));
    std::ofstream(dir + "/go").put(0);
    EXPECT_EQ(testing::finish_command(c, 30).exit_code(), 0);
  }
  ASSERT_GT(servers[0], 1);
  EXPECT_EQ(servers[0], servers[1]);
  EXPECT_NE(servers[0], ::getpid());
  EXPECT_NE(::getsid(servers[0]), ::getsid(0));
}

TEST(ForkServer, AServerVariableSetByHandIsAnError) {
  const auto r = testing::run_command(
      "fork-server-by-hand", {"/usr/bin/env", "DTORCH_FORK_SERVER=mine", DTORCH_CLI, "--help"});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "dtorch: error: DTORCH_FORK_SERVER=mine asks for a fork server of dtorch's "
                       "test suite, but this process was not started as one; unset "
                       "DTORCH_FORK_SERVER\n"))
      << r.err;
}

// Note [Test server]: ctest's tests run through dtorch_test_client, as forks of a test server.
// What the probe printed: its pid, directory and value.
struct Probe {
  pid_t pid = -1;
  std::string dir, value;
};

Probe probe_of(const std::string& out) {
  Probe p;
  char dir[4096] = "", value[256] = "";
  int pid = -1;
  if (std::sscanf(out.c_str(), "pid=%d dir=%4095s value=%255s", &pid, dir, value) >= 2) {
    p.pid = pid;
    p.dir = dir;
    p.value = value;
  }
  return p;
}

std::vector<std::string> probe_line(const std::string& how) {
  return {DTORCH_TEST_CLIENT, paths::executable_path(), "--probe-test-server", how};
}

TEST(ForkServer, TheTestClientRunsATestInItsDirectoryAndEndsAsItDid) {
  const std::string dir = testing::scratch_dir("test-client");
  for (const std::string how : {"0", "3", "signal"}) {
    paths::create_directories(dir + "/" + how);
    const auto c = testing::start_command(dir + "/" + how, probe_line(how), {"PROBE_VALUE=v" + how},
                                          dir + "/" + how);
    const auto r = testing::finish_command(c, 60);
    const Probe p = probe_of(r.out);
    EXPECT_EQ(p.dir, dir + "/" + how) << r.out << r.err;
    EXPECT_EQ(p.value, "v" + how) << r.out;
    // Served, the test is another process (a fork of the server); exec'd, the client itself.
    if (served_here()) {
      EXPECT_NE(p.pid, c.pid) << r.out;
    } else {
      EXPECT_EQ(p.pid, c.pid) << r.out;
    }
    if (how == "signal") {
      ASSERT_TRUE(WIFSIGNALED(r.status)) << r.status << "\n" << r.err;
      EXPECT_EQ(WTERMSIG(r.status), SIGTERM);
    } else {
      EXPECT_EQ(r.exit_code(), std::stoi(how)) << r.err;
    }
  }
}

TEST(ForkServer, AKilledTestClientTakesItsTestWithIt) {
  if (!served_here()) GTEST_SKIP() << "DTORCH_FORK_WORKERS=0: the client exec's the test";
  const std::string dir = testing::scratch_dir("test-client-killed");
  const auto c = testing::start_command(dir, probe_line("sleep"), {"PROBE_VALUE=sleeps"});
  Probe p;
  ASSERT_TRUE(testing::wait_until(
      [&] { return (p = probe_of(testing::read_file(dir + "/stdout"))).pid > 0; }, 30))
      << testing::read_file(dir + "/stderr");
  ASSERT_NE(p.pid, c.pid);
  ASSERT_TRUE(testing::alive(p.pid));
  ::kill(c.pid, SIGKILL);  // as ctest's timeout does
  testing::finish_command(c, 20);
  EXPECT_TRUE(testing::wait_until([&] { return !testing::alive(p.pid); }, 10));
}

}  // namespace
}  // namespace dtorch::launch
