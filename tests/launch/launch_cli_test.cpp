// `dtorch launch` as users run it (the real CLI binary, output captured to files): prefixes,
// stdout/stderr kept apart, failure messages, --show-ranks, torchrun spellings, multi-node
// ranks, and SIGTERM to the launcher taking every worker down with it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtorch/core/paths.h"
#include "dtorch/launch/node_rendezvous.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;
using testing::alive;
using testing::contains;
using testing::free_port;
using testing::read_file;
using Cli = testing::Command;
using CliResult = testing::CommandResult;

Cli start_cli(const std::string& dir, std::vector<std::string> args) {
  return testing::start_launch(dir, std::move(args));
}

CliResult finish_cli(const Cli& cli, double limit = 20) {
  return testing::finish_command(cli, limit);
}

CliResult run_cli(const std::string& name, const std::vector<std::string>& args) {
  return testing::run_launch(name, args, 20);
}

// Waits until every file in `paths` has something in it.
bool wait_for_files(const std::vector<std::string>& paths, double limit) {
  return testing::wait_until(
      [&] {
        return std::all_of(paths.begin(), paths.end(),
                           [](const std::string& p) { return !read_file(p).empty(); });
      },
      limit);
}

TEST(LaunchCli, PrefixesLinesAndKeepsStreamsApart) {
  auto r = run_cli("cli-prefix", {"--standalone", "--nproc-per-node", "2", "--", "sh", "-c",
                                  "echo out $RANK; echo err $RANK >&2; printf 'a\\rb\\r'; "
                                  "printf \"tail $RANK\""});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string p = "[n0 r" + std::to_string(rank) + "] ";
    std::string k = std::to_string(rank);
    EXPECT_TRUE(contains(r.out, p + "out " + k + "\n")) << r.out;
    EXPECT_TRUE(contains(r.err, p + "err " + k + "\n")) << r.err;
    EXPECT_FALSE(contains(r.out, "err " + k)) << r.out;
    EXPECT_FALSE(contains(r.err, "out " + k)) << r.err;
    EXPECT_TRUE(contains(r.out, p + "a\r" + p + "b\r")) << r.out;   // '\r' updates pass
    EXPECT_TRUE(contains(r.out, p + "tail " + k + "\n")) << r.out;  // flushed at exit
  }
}

TEST(LaunchCli, LinesOfManyWorkersNeverInterleave) {
  // Each worker writes 300 lines of 2000 characters as fast as it can.
  auto r =
      run_cli("cli-interleave", {"--standalone", "--nproc-per-node", "3", "--", "sh", "-c",
                                 "line=$(printf '%02000d' $RANK); i=0; while [ $i -lt 300 ]; do "
                                 "echo $line; i=$((i+1)); done"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int count = 0;
  const std::regex whole(R"(\[n0 r([0-2])\] 0{1999}([0-2]))");
  while (std::getline(lines, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, whole)) << "mixed line: " << line.substr(0, 80);
    EXPECT_EQ(m[1], m[2]);
    ++count;
  }
  EXPECT_EQ(count, 900);
}

TEST(LaunchCli, NamesTheFailedRankAndStopsTheOthers) {
  std::string dir = testing::scratch_dir("cli-fail");
  Cli cli = start_cli(dir, {"--standalone", "--nproc-per-node", "3", "--", "sh", "-c",
                            "echo $$ > " + dir +
                                "/pid.$RANK; if [ $RANK = 1 ]; then "
                                "sleep 0.3; exit 3; fi; exec sleep 60"});
  // Timed from the workers' start: loading the launcher itself is slow on a busy machine.
  ASSERT_TRUE(wait_for_files({dir + "/pid.0", dir + "/pid.1", dir + "/pid.2"}, 10));
  auto t0 = Clock::now();
  CliResult r = finish_cli(cli);
  EXPECT_EQ(r.exit_code(), 3) << r.err;
  EXPECT_LT(testing::seconds_since(t0), 5.0);
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(dtorch launch: rank 1 \(node 0, local rank 1, pid \d+\) exited )"
                        R"(with code 3)")))
      << r.err;
  for (int rank : {0, 2}) {
    pid_t pid = std::stoi(read_file(dir + "/pid." + std::to_string(rank)));
    EXPECT_FALSE(alive(pid)) << "rank " << rank << " outlived the launcher";
  }
}

TEST(LaunchCli, NamesTheSignalThatKilledAWorker) {
  auto r = run_cli("cli-sigkill", {"--standalone", "--nproc-per-node", "2", "--", "sh", "-c",
                                   "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(r.exit_code(), 137);
  EXPECT_TRUE(contains(r.err, "rank 1 (node 0, local rank 1, pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
}

TEST(LaunchCli, RestartsOnceAndSaysSo) {
  auto r =
      run_cli("cli-restart",
              {"--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--", "sh", "-c",
               "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 2; fi; "
               "echo attempt $TORCHELASTIC_RESTART_COUNT"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.err, "restart 1 of 1")) << r.err;
  EXPECT_TRUE(contains(r.out, "[n0 r0] attempt 1\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[n0 r1] attempt 1\n")) << r.out;
}

TEST(LaunchCli, SigtermToLauncherEndsEveryWorker) {
  std::string dir = testing::scratch_dir("cli-sigterm");
  // Each worker also starts a child of its own, which must go down with it.
  Cli cli = start_cli(
      dir, {"--standalone", "--nproc-per-node", "2", "--grace-period", "5", "--", "sh", "-c",
            "sleep 60 & echo $! > " + dir + "/child.$RANK; echo $$ > " + dir + "/pid.$RANK; wait"});
  std::vector<std::string> files;
  for (const char* f : {"/pid.0", "/pid.1", "/child.0", "/child.1"})
    files.push_back(dir + f);
  ASSERT_TRUE(wait_for_files(files, 10)) << "workers did not start";
  std::vector<pid_t> pids;
  for (const auto& f : files)
    pids.push_back(std::stoi(read_file(f)));
  for (pid_t p : pids)
    ASSERT_TRUE(alive(p));
  ::kill(cli.pid, SIGTERM);
  auto t0 = Clock::now();
  CliResult r = finish_cli(cli);
  EXPECT_EQ(r.exit_code(), 143) << r.err;
  EXPECT_LT(testing::seconds_since(t0), 4.0);  // no grace wait
  EXPECT_TRUE(contains(r.err, "SIGTERM")) << r.err;
  for (pid_t p : pids)
    EXPECT_FALSE(alive(p)) << "pid " << p << " outlived the launcher";
}

TEST(LaunchCli, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  std::string dir = testing::scratch_dir("cli-grace");
  Cli cli = start_cli(dir, {"--standalone", "--grace-period", "0.5", "--", "sh", "-c",
                            "trap '' TERM; echo $$ > " + dir +
                                "/pid.0; "
                                "while :; do sleep 0.1; done"});
  ASSERT_TRUE(wait_for_files({dir + "/pid.0"}, 10));
  pid_t pid = std::stoi(read_file(dir + "/pid.0"));
  ::kill(cli.pid, SIGINT);
  CliResult r = finish_cli(cli);
  EXPECT_EQ(r.exit_code(), 130) << r.err;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_FALSE(alive(pid));
}

TEST(LaunchCli, ShowRanksFiltersOutput) {
  auto r = run_cli("cli-show", {"--standalone", "--nproc-per-node", "3", "--show-ranks", "0,2",
                                "--", "sh", "-c", "echo hello $RANK; echo warn $RANK >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[n0 r0] hello 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "[n0 r2] hello 2")) << r.out;
  EXPECT_FALSE(contains(r.out, "r1]")) << r.out;
  EXPECT_FALSE(contains(r.err, "r1]")) << r.err;
}

TEST(LaunchCli, HiddenRankThatFailsStillShowsItsError) {
  auto r =
      run_cli("cli-show-fail", {"--standalone", "--nproc-per-node", "2", "--show-ranks", "0", "--",
                                "sh", "-c", "if [ $RANK = 1 ]; then echo boom >&2; exit 1; fi"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "[n0 r1] boom")) << r.err;
}

TEST(LaunchCli, ProgramNotFoundIsNamed) {
  auto r = run_cli("cli-notfound", {"--", "dtorch-no-such-program-xyz", "x"});
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_TRUE(contains(r.err, "cannot run dtorch-no-such-program-xyz: No such file")) << r.err;
}

TEST(LaunchCli, TimeoutIsNamed) {
  auto r = run_cli("cli-timeout", {"--standalone", "--timeout", "0.5", "--", "sleep", "30"});
  EXPECT_EQ(r.exit_code(), 124);
  EXPECT_TRUE(contains(r.err, "exceeded its time limit")) << r.err;
}

TEST(LaunchCli, TorchrunStyleProgramWithoutDoubleDash) {
  auto r = run_cli("cli-nodash", {"--standalone", "--nproc_per_node=2", "sh", "-c",
                                  "echo ws=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE", "--x"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[n0 r1] ws=2 lws=2")) << r.out;
}

TEST(LaunchCli, BadFlagsAreConfigErrors) {
  auto r = run_cli("cli-badflags", {"--nproc-per-node", "0", "--", "true"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "--nproc-per-node=0 must be at least 1")) << r.err;
  r = run_cli("cli-badflags", {"--master-port", "70000", "--", "true"});
  EXPECT_TRUE(contains(r.err, "--master-port=70000 is not a TCP port")) << r.err;
  r = run_cli("cli-badflags", {"--nproc-per-node", "2"});
  EXPECT_TRUE(contains(r.err, "no program to run")) << r.err;
}

TEST(LaunchCli, SecondNodeGetsItsRanksAndTheHostInItsPrefix) {
  // Two launchers as on two hosts: node 1's workers are global ranks 2 and 3, and on a job of
  // several nodes each line names its host. (That node 1 does not serve the store itself is in
  // launch_faults_test.cpp: alone, it finds nobody at the master.)
  int port = free_port();
  std::vector<Cli> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(
        start_cli(testing::scratch_dir("cli-node" + std::to_string(node)),
                  {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", std::to_string(port), "--", "sh",
                   "-c", "echo rank=$RANK local=$LOCAL_RANK group=$GROUP_RANK ws=$WORLD_SIZE"}));
  }
  finish_cli(nodes[0]);
  CliResult r = finish_cli(nodes[1]);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::string host = short_hostname();
  EXPECT_TRUE(contains(r.out, "[" + host + " n1 r2] rank=2 local=0 group=1 ws=4")) << r.out;
  EXPECT_TRUE(contains(r.out, "[" + host + " n1 r3] rank=3 local=1 group=1 ws=4")) << r.out;
}

TEST(LaunchCli, TwoNodesMeetAtTheStoreOfNodeZero) {
  // Two launchers as on two hosts; the workers (this test binary, see launch_store_meet in
  // launcher_test.cpp) join node 0's store from both nodes and wait for all four ranks.
  int port = free_port();
  std::string self = paths::executable_path();
  std::vector<Cli> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(
        start_cli(testing::scratch_dir("cli-two-nodes-" + std::to_string(node)),
                  {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
                   "--master-port", std::to_string(port), "--timeout", "30", "--", self,
                   "--dtorch-worker", "launch_store_meet"}));
  }
  for (const Cli& cli : nodes) {
    CliResult r = finish_cli(cli, 40);
    EXPECT_EQ(r.exit_code(), 0) << r.out << r.err;
  }
}

}  // namespace
}  // namespace dtorch::launch
