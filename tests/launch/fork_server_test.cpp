// Note [Fork server]: the `dtorch` command lines the tests run are forks of one `dtorch` that
// serves them; each must run as an exec'd `dtorch` would: in its directory, with its
// environment and streams, and with its own exit status or the signal that killed it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace
}  // namespace dtorch::launch
