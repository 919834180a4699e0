// Faults a job meets and how `dtorch launch` answers them, each bounded in time: a node that
// never arrives, a master port in use, a master address that leads nowhere, a worker stopped
// with SIGSTOP, one node's launcher killed; and --log-dir keeping each rank's output.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dtorch/comm/communicator.h"
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
using testing::seconds_since;
using testing::wait_until;

std::vector<pid_t> wait_for_pids(const std::string& dir, const std::vector<int>& ranks,
                                 double limit) {
  std::vector<pid_t> pids;
  bool ok = wait_until(
      [&] {
        for (int r : ranks)
          if (read_file(dir + "/pid." + std::to_string(r)).empty()) return false;
        return true;
      },
      limit);
  if (!ok) return pids;
  for (int r : ranks)
    pids.push_back(std::stoi(read_file(dir + "/pid." + std::to_string(r))));
  return pids;
}

// Allreduces forever (until a peer fails it), after the first one writing its pid to
// DIR/pid.<rank>, so a test can stop or kill ranks in the middle of collectives.
DTORCH_TEST_WORKER(fault_allreduce_loop) {
  auto comm = comm::Communicator::from_env();
  auto t = at::ones({1024});
  for (long i = 0;; ++i) {
    comm->allreduce(t, comm::ReduceOp::Avg, "test step");
    if (i == 0) {
      std::string tmp = args.at(0) + "/pid.tmp" + std::to_string(comm->rank());
      std::ofstream(tmp) << ::getpid();
      paths::rename(tmp, args.at(0) + "/pid." + std::to_string(comm->rank()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string self_exe() {
  return paths::executable_path();
}

TEST(LaunchFaults, NodeThatNeverArrivesIsNamedAfterTheRdzvTimeout) {
  // Two jobs at once. Job A: --nnodes 2 and only node 0 starts. Job B: nodes 0 and 2 of 3
  // come, node 1 never does. Every launcher gives up after --rdzv-timeout, names the missing
  // node, and starts no worker.
  std::vector<testing::Command> nodes;
  int port_a = free_port(), port_b = free_port();
  nodes.push_back(testing::start_launch(
      testing::scratch_dir("faults-rdzv-alone"),
      {"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(port_a),
       "--rdzv-timeout", "3", "--", "sh", "-c", "echo worker started"}));
  for (int node : {0, 2}) {
    nodes.push_back(testing::start_launch(
        testing::scratch_dir("faults-rdzv-" + std::to_string(node)),
        {"--nnodes", "3", "--node-rank", std::to_string(node), "--master-port",
         std::to_string(port_b), "--rdzv-timeout", "3", "--", "sh", "-c", "echo worker started"}));
  }
  std::string host = short_hostname();
  std::string alone = "1 of 2 node(s) arrived (node 0 on " + host + "); missing node rank(s): 1";
  std::string two_of_three = "2 of 3 node(s) arrived (node 0 on " + host + ", node 2 on " + host +
                             "); missing node rank(s): 1";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    SCOPED_TRACE("launcher " + std::to_string(i));
    auto r = testing::finish_command(nodes[i], 30);
    EXPECT_EQ(r.exit_code(), 1) << r.err;
    EXPECT_GE(r.seconds, 2.9);
    EXPECT_LT(r.seconds, 15.0);
    if (i < 2) {
      std::string roll = i == 0 ? alone : two_of_three;
      EXPECT_TRUE(contains(r.err, "rendezvous failed after 3 s (--rdzv-timeout): " + roll))
          << r.err;
    } else {
      // Node 2 may lose the store when node 0 gives up at its (earlier) deadline.
      EXPECT_TRUE(contains(r.err, "rendezvous failed")) << r.err;
      EXPECT_TRUE(contains(r.err, two_of_three)) << r.err;
    }
    EXPECT_FALSE(contains(r.out, "worker started")) << r.out;
  }
}

TEST(LaunchFaults, MasterPortInUseIsAClearErrorAtOnce) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  std::string port = std::to_string(ntohs(a.sin_port));
  auto r = testing::run_launch("faults-port-in-use", {"--nproc-per-node", "2", "--master-port",
                                                      port, "--", "echo", "started"});
  ::close(s);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.err, "cannot serve the rendezvous store on port " + port)) << r.err;
  EXPECT_TRUE(contains(r.err, "--master-port")) << r.err;
  EXPECT_FALSE(contains(r.out, "started")) << r.out;
}

TEST(LaunchFaults, SecondNodeWithNothingAtTheMasterFailsAfterTheRdzvTimeout) {
  // Node 1 alone: it must not serve the store itself (node 0 does), so nobody answers.
  std::string port = std::to_string(free_port());
  auto r = testing::run_launch(
      "faults-no-master", {"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                           "--master-port", port, "--rdzv-timeout", "2", "--", "echo", "started"});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(
      contains(r.err, "cannot reach the rendezvous store at 127.0.0.1:" + port + " within 2 s"))
      << r.err;
  EXPECT_FALSE(contains(r.out, "started")) << r.out;
}

TEST(LaunchFaults, MasterAddressThatIsNotThisHostFailsOnNodeZero) {
  // 192.0.2.1 (TEST-NET-1) is never assigned: the store node 0 serves is not reachable there,
  // so neither the workers nor the other nodes would find it.
  auto r = testing::run_launch(
      "faults-wrong-master",
      {"--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1", "--master-port",
       std::to_string(free_port()), "--rdzv-timeout", "2", "--", "echo", "started"});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_TRUE(contains(r.err, "cannot reach it through --master-addr 192.0.2.1")) << r.err;
  EXPECT_FALSE(contains(r.out, "started")) << r.out;
}

TEST(LaunchFaults, StoppedWorkerIsNamedByItsPeersAndKilled) {
  // Rank 1 is stopped (SIGSTOP) in the middle of the allreduce loop. Rank 0's allreduce times
  // out after DTORCH_TIMEOUT and names rank 1 and the collective; the launcher stops the group
  // with SIGTERM and continues the stopped process, which then ends without the grace period.
  std::string dir = testing::scratch_dir("faults-sigstop");
  auto cli = testing::start_launch(
      dir,
      {"--nproc-per-node", "2", "--standalone", "--grace-period", "6", "--timeout", "60", "--",
       self_exe(), "--dtorch-worker", "fault_allreduce_loop", dir},
      {"DTORCH_TIMEOUT=3"});
  auto pids = wait_for_pids(dir, {0, 1}, 30);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start: " << read_file(dir + "/stderr");
  ASSERT_EQ(::kill(pids[1], SIGSTOP), 0);
  auto t0 = Clock::now();
  auto r = testing::finish_command(cli, 60);
  double took = seconds_since(t0);
  // DTORCH_TIMEOUT and slack: neither the diagnosis window (a stopped rank on this host is
  // known at once) nor the 6 s grace period.
  EXPECT_LT(took, 3 + 5.0) << r.err;
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.err, "[n0 r0] ")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0: allreduce #")) << r.err;
  EXPECT_TRUE(contains(r.err, "test step")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank(s) 1 are stopped (SIGSTOP or ^Z)")) << r.err;
  EXPECT_TRUE(contains(r.err, "dtorch launch: rank 0 (node 0, local rank 0")) << r.err;
  EXPECT_TRUE(contains(r.err, str("dtorch launch: rank 1 (pid ", pids[1],
                                  ") is stopped (SIGSTOP or ^Z); continuing it")))
      << r.err;
  EXPECT_FALSE(contains(r.err, "after SIGTERM (--grace-period); sending SIGKILL")) << r.err;
  EXPECT_FALSE(alive(pids[1])) << "the stopped worker outlived the launcher";
  EXPECT_FALSE(alive(pids[0]));
}

TEST(LaunchFaults, KilledNodeLauncherTakesItsWorkersAndFailsTheOtherNode) {
  // Two launchers as two nodes. Node 1's launcher is killed with SIGKILL: its workers die with
  // it (parent-death signal), and node 0's workers fail their next allreduce, name ranks 2 and
  // 3, and exit; node 0's launcher reports and exits.
  std::string dir = testing::scratch_dir("faults-node-killed");
  int port = free_port();
  std::vector<testing::Command> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(testing::start_launch(
        testing::scratch_dir("faults-node-killed-" + std::to_string(node)),
        {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
         "--master-port", std::to_string(port), "--rdzv-timeout", "30", "--grace-period", "1",
         "--timeout", "60", "--", self_exe(), "--dtorch-worker", "fault_allreduce_loop", dir},
        {"DTORCH_TIMEOUT=10"}));
  }
  auto pids = wait_for_pids(dir, {0, 1, 2, 3}, 40);
  if (pids.size() != 4u) {
    for (auto& n : nodes)
      ::kill(n.pid, SIGKILL);
    for (auto& n : nodes)
      testing::finish_command(n, 10);
    FAIL() << "workers did not start: " << read_file(nodes[0].dir + "/stderr")
           << read_file(nodes[1].dir + "/stderr");
  }
  ASSERT_EQ(::kill(nodes[1].pid, SIGKILL), 0);
  auto t0 = Clock::now();
  testing::finish_command(nodes[1], 10);
  EXPECT_TRUE(wait_until([&] { return !alive(pids[2]) && !alive(pids[3]); }, 5))
      << "node 1's workers outlived their launcher";
  auto r = testing::finish_command(nodes[0], 40);
  EXPECT_LT(seconds_since(t0), 10 + 5 + 1 + 5.0);  // timeout, diagnosis, grace, slack
  EXPECT_NE(r.exit_code(), 0);
  std::string host = short_hostname();
  // Whichever of node 0's ranks fails first reports (the other may be torn down before).
  EXPECT_TRUE(contains(r.err, "[" + host + " n0 r")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank(s) 2, 3 died")) << r.err;
  EXPECT_TRUE(contains(r.err, "dtorch launch: rank ")) << r.err;
  EXPECT_FALSE(alive(pids[0]));
  EXPECT_FALSE(alive(pids[1]));
}

TEST(LaunchFaults, LogDirKeepsEachRanksOutputAcrossRestarts) {
  std::string logs = testing::scratch_dir("faults-logdir") + "/logs";
  auto r = testing::run_launch(
      "faults-logdir-cli",
      {"--standalone", "--nproc-per-node", "2", "--show-ranks", "0", "--max-restarts", "1",
       "--log-dir", logs, "--", "sh", "-c",
       "echo out $RANK attempt $TORCHELASTIC_RESTART_COUNT; echo err $RANK >&2; "
       "printf 'no newline'; "
       "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 2; fi"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_FALSE(contains(r.out, "out 1")) << r.out;  // --show-ranks hides rank 1's console
  std::string r0 = read_file(logs + "/rank0.log"), r1 = read_file(logs + "/rank1.log");
  EXPECT_TRUE(contains(r0, "out 0 attempt 1\n")) << r0;
  EXPECT_TRUE(contains(r0, "err 0\n")) << r0;
  EXPECT_TRUE(contains(r0, "no newline\n")) << r0;
  EXPECT_FALSE(contains(r0, "[n0")) << r0;  // unprefixed: the file says whose it is
  // Rank 1's file has both attempts, the launcher's verdict, and the restart between them.
  auto first = r1.find("out 1 attempt 0\n");
  auto verdict = r1.find("dtorch launch: rank 1 (node 0, local rank 1");
  auto restart = r1.find("dtorch launch: restart 1 of 1");
  auto second = r1.find("out 1 attempt 1\n");
  ASSERT_NE(first, std::string::npos) << r1;
  ASSERT_NE(verdict, std::string::npos) << r1;
  ASSERT_NE(restart, std::string::npos) << r1;
  ASSERT_NE(second, std::string::npos) << r1;
  EXPECT_LT(first, verdict);
  EXPECT_LT(verdict, restart);
  EXPECT_LT(restart, second);
  EXPECT_TRUE(contains(r1, "exited with code 2")) << r1;
  EXPECT_FALSE(paths::exists(logs + "/rank2.log"));
}

}  // namespace
}  // namespace dtorch::launch
