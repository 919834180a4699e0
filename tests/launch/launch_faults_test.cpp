// Faults a job meets and how `dtorch launch` answers them, each bounded in time: a node that
// never arrives, a master port in use, a master address that leads nowhere, a worker stopped
// with SIGSTOP, one node's launcher killed, a stranger on the store's port; and --log-dir
// keeping each rank's output.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/core/torch_compat.h"
#include "dtorch/launch/node_rendezvous.h"
#include "dtorch/launch/store.h"
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

// A short job's work: the store at start-up, then 30 allreduces 50 ms apart (about 2 s).
DTORCH_TEST_WORKER(fault_short_job) {
  auto comm = comm::Communicator::from_env();
  auto t = at::ones({1024});
  for (int i = 0; i < 30; ++i) {
    comm->allreduce(t, comm::ReduceOp::Avg, "test step");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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

// A connection to 127.0.0.1:port once something listens there (-1 after `limit` seconds).
int connect_when_listening(int port, double limit) {
  int fd = -1;
  wait_until(
      [&] {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return true;
        ::close(fd);
        fd = -1;
        return false;
      },
      limit);
  return fd;
}

// Resident memory of process `pid` in MiB (0 once it is gone).
double rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return 0;
}

// `c`'s result once it ends (within `limit` seconds), and the most resident memory it held, in
// MiB, sampled every 50 ms until then.
std::pair<testing::CommandResult, double> finish_watching_memory(const testing::Command& c,
                                                                 double limit) {
  std::atomic<double> peak{0};
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      peak = std::max(peak.load(), rss_mib(c.pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto r = testing::finish_command(c, limit);
  done = true;
  watch.join();
  return {std::move(r), peak.load()};
}

// Two strangers on the store at 127.0.0.1:port once the launcher has claimed it (a classic
// server they reach first stalls the launcher itself until --rdzv-timeout), as they would be for
// most of a job's life: one sends a NUL byte and holds the connection, the other a SET (2.x:
// after VALIDATE and its magic number) announcing a 2 GiB key. Their sockets, to close; none
// when the store never listened.
std::vector<int> strangers_on(int port, const std::string& dir) {
  if (!wait_until([&] { return testing::listening(port); }, 20)) {
    ADD_FAILURE() << "the store never listened: " << read_file(dir + "/stderr");
    return {};
  }
  auto job = connect_store("127.0.0.1", port, std::chrono::seconds(10));
  EXPECT_TRUE(wait_until([&] { return job->check({"dtorch/job"}); }, 20));
  const int held = connect_when_listening(port, 20);
  const int big = connect_when_listening(port, 20);
  EXPECT_EQ(::send(held, "", 1, MSG_NOSIGNAL), 1);
  std::vector<uint8_t> set;
  if (compat::kTorch2)
    set = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x01};
  else
    set = {0x00};
  const uint64_t length = uint64_t{1} << 31;
  for (int i = 0; i < 8; ++i)
    set.push_back(static_cast<uint8_t>(length >> (8 * i)));
  EXPECT_EQ(::send(big, set.data(), set.size(), MSG_NOSIGNAL), static_cast<ssize_t>(set.size()));
  return {held, big};
}

// Note [Where the store listens], Note [TCPStore backend]: a stranger on the store's port sends
// one byte and holds the connection, another a SET announcing a 2 GiB key. The libuv server
// (LibTorch 2.4 on) serves the job around them: it ends as it does alone, and the launcher's
// memory stays flat. LibTorch's classic server (1.13; USE_LIBUV=0) reads one request at a time,
// so the held byte stalls it (docs/launch.md says so): the workers name the store after
// DTORCH_TIMEOUT, and the launcher, whose store cannot close, still ends at once after them.
TEST(LaunchFaults, StrangerOnTheStorePortCannotHoldTheJob) {
  const bool libuv = served_by_libuv(serve_store(0, 1, std::chrono::seconds(5)));
  const std::string dir = testing::scratch_dir("faults-stranger");
  auto launch = [&](int port) {
    return testing::start_launch(
        dir,
        {"--nproc-per-node", "2", "--master-port", std::to_string(port), "--timeout", "60", "--",
         self_exe(), "--dtorch-worker", "fault_short_job"},
        {"DTORCH_TIMEOUT=5"});
  };
  auto t0 = Clock::now();
  const auto [alone, alone_peak] = finish_watching_memory(launch(free_port()), 60);
  const double alone_s = seconds_since(t0);
  ASSERT_EQ(alone.exit_code(), 0) << alone.err;

  const int port = free_port();
  t0 = Clock::now();
  auto cli = launch(port);
  const std::vector<int> strangers = strangers_on(port, dir);
  ASSERT_EQ(strangers.size(), 2u);
  const auto [r, peak] = finish_watching_memory(cli, 60);
  const double took = seconds_since(t0);
  for (int fd : strangers)
    ::close(fd);
  if (libuv) {
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    EXPECT_LT(took, alone_s + 5) << r.err;
    // Against the launcher's own peak alone, which LibTorch's libraries set (400 to 550 MiB for a
    // CUDA build): a server that believed the SET would grow by its 2 GiB.
    EXPECT_LT(peak, alone_peak + 256) << "the launcher's memory grew with the stranger's SET "
                                      << "(alone it peaked at " << alone_peak << " MiB)";
  } else {
    EXPECT_NE(r.exit_code(), 0) << r.err;
    EXPECT_TRUE(contains(r.err, "has not answered")) << r.err;
    EXPECT_TRUE(contains(r.err, "did not close within 2 s")) << r.err;
    // The workers' dialect probes (no answer: at most 4 s), DTORCH_TIMEOUT, the watchdog's
    // grace (10 s for 2.x's handshake, where they wait), closing the store, and slack.
    EXPECT_LT(took, 4 + 5 + 10 + 2 + 5.0) << r.err;
  }
}

// The processes `pid` has started and not yet waited for (every thread's).
int children_of(pid_t pid) {
  int n = 0;
  std::error_code ec;
  const std::string tasks = str("/proc/", pid, "/task");
  for (const std::string& task : paths::list_directory(tasks, ec)) {
    std::istringstream kids(read_file(tasks + "/" + task + "/children"));
    for (pid_t kid; kids >> kid;)
      ++n;
  }
  return n;
}

// SIGTERM ends a launcher whose store strangers hold, whatever it and its workers wait on: it
// stops the workers and exits 143 within the grace period and the 2 s its store gets to close.
TEST(LaunchFaults, SigtermEndsALauncherWhoseStoreStrangersHold) {
  const std::string dir = testing::scratch_dir("faults-stranger-sigterm");
  const int port = free_port();
  auto cli = testing::start_launch(
      dir,
      {"--nproc-per-node", "2", "--master-port", std::to_string(port), "--grace-period", "3", "--",
       self_exe(), "--dtorch-worker", "fault_allreduce_loop", dir},
      {"DTORCH_TIMEOUT=60"});
  const std::vector<int> strangers = strangers_on(port, dir);
  ASSERT_EQ(strangers.size(), 2u);
  // Its workers started (on a busy machine, more than a second after its store listened), then
  // waiting: the launcher watches for signals before it starts them.
  ASSERT_TRUE(wait_until([&] { return children_of(cli.pid) == 2; }, 20))
      << read_file(dir + "/stderr");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = Clock::now();
  ASSERT_EQ(::kill(cli.pid, SIGTERM), 0);
  const auto r = testing::finish_command(cli, 30);
  const double took = seconds_since(t0);
  for (int fd : strangers)
    ::close(fd);
  EXPECT_EQ(r.exit_code(), 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.err, "dtorch launch: got SIGTERM; stopped all workers")) << r.err;
  EXPECT_LT(took, 3 + 2 + 3.0) << r.err;  // grace period, closing the store, slack
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
