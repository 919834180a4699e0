// Communicator: collectives give the values computed by hand, and failures name the rank at
// fault (a stalled rank, a dead rank) within the timeout instead of hanging.
#include "dtorch/comm/communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "dtorch/core/error.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::comm {
namespace {

using testing::read_file;

TEST(Communicator, WorldOfOneNeedsNoEnvironment) {
  launch::RankInfo info;  // defaults: rank 0 of 1
  auto c = Communicator::create(info);
  EXPECT_EQ(c->size(), 1);
  auto t = torch::arange(4, torch::kFloat);
  c->allreduce(t, ReduceOp::Avg);
  EXPECT_TRUE(t.equal(torch::arange(4, torch::kFloat)));
  c->broadcast(t, 0);
  c->barrier();
  EXPECT_EQ(c->broadcast_string("abc", 0), "abc");
}

// args: DIR PATH, where PATH is "shm" (single-node shared memory, the default) or "gloo".
void choose_path(const std::vector<std::string>& args) {
  setenv("DTORCH_SHM", args.at(1) == "gloo" ? "0" : "1", 1);
}

// An allreduce expected to fail: its CommError, then "seconds S" (how long the allreduce took),
// goes to DIR/error for the test to read, and the worker fails.
void allreduce_expecting_failure(Communicator& c, const std::string& dir,
                                 const std::string& what = "") {
  auto t = torch::ones({8});
  auto t0 = std::chrono::steady_clock::now();
  try {
    c.allreduce(t, ReduceOp::Sum, what);
  } catch (const CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream(dir + "/error") << e.what() << "\nseconds " << s;
    throw;
  }
}

// The "seconds S" that allreduce_expecting_failure wrote after the error.
double seconds_in(const std::string& error) {
  return std::stod(error.substr(error.rfind("seconds ") + 8));
}

DTORCH_TEST_WORKER(comm_collectives) {
  choose_path(args);
  auto c = Communicator::from_env();
  int r = c->rank(), n = c->size();
  std::ostringstream report;
  // allreduce: sum, avg, max on float; sum on int64; bf16 (cast on Gloo 1.13)
  auto s = torch::full({5}, float(r + 1));
  c->allreduce(s, ReduceOp::Sum);
  report << "sum " << s[0].item<float>() << "\n";
  auto a = torch::full({3}, double(r));
  c->allreduce(a, ReduceOp::Avg);
  report << "avg " << a[0].item<double>() << "\n";
  auto m = torch::tensor({double(r), double(-r - 1)});
  c->allreduce(m, ReduceOp::Max);
  report << "max " << m[0].item<double>() << " " << m[1].item<double>() << "\n";
  auto i = torch::full({2}, int64_t(r), torch::kLong);
  c->allreduce(i);
  report << "isum " << i[0].item<int64_t>() << "\n";
  auto h = torch::full({4}, 1.5, torch::kBFloat16);
  c->allreduce(h);
  report << "bf16 " << h[0].item<float>() << " " << (h.scalar_type() == torch::kBFloat16) << "\n";
  // async: two in flight at once, waited in reverse order
  auto x = torch::ones({1000}), y = torch::full({10}, 2.0);
  auto wx = c->allreduce_async(x, ReduceOp::Sum);
  auto wy = c->allreduce_async(y, ReduceOp::Sum);
  wy.wait();
  wx.wait();
  report << "async " << x.sum().item<float>() << " " << y[0].item<float>() << "\n";
  // broadcast from the last rank, allgather, send/recv ring, string broadcast
  auto b = torch::full({2}, float(r));
  c->broadcast(b, n - 1);
  report << "bcast " << b[0].item<float>() << "\n";
  std::vector<torch::Tensor> all(n);
  for (auto& t : all)
    t = torch::empty({2});
  c->allgather(all, torch::full({2}, float(10 * r)));
  report << "gather";
  for (auto& t : all)
    report << " " << t[1].item<float>();
  report << "\n";
  auto out = torch::full({3}, float(r));
  auto in = torch::empty({3});
  if (r % 2 == 0) {
    c->send(out, (r + 1) % n);
    c->recv(in, (r + n - 1) % n);
  } else {
    c->recv(in, (r + n - 1) % n);
    c->send(out, (r + 1) % n);
  }
  report << "recv " << in[0].item<float>() << "\n";
  report << "string " << c->broadcast_string(r == 0 ? "hello from 0" : "", 0) << "\n";
  report << "empty [" << c->broadcast_string("", 0) << "]\n";  // no bytes to copy
  c->barrier();
  std::ofstream(args.at(0) + "/rank" + std::to_string(r)) << report.str();
}

class CommunicatorPath : public ::testing::TestWithParam<std::string> {};

TEST_P(CommunicatorPath, CollectivesOnThreeRanks) {
  std::string dir = testing::scratch_dir("comm_collectives");
  ASSERT_EQ(testing::run_ranks(3, "comm_collectives", {dir, GetParam()}), 0);
  for (int r = 0; r < 3; ++r) {
    std::string got = read_file(dir + "/rank" + std::to_string(r));
    std::string want = std::string("sum 6\navg 1\nmax 2 -1\nisum 3\nbf16 4.5 1\nasync 3000 6\n") +
                       "bcast 2\ngather 0 10 20\nrecv " + std::to_string((r + 2) % 3) +
                       "\nstring hello from 0\nempty []\n";
    EXPECT_EQ(got, want) << "rank " << r;
  }
}

// Rank 1 stalls (as under SIGSTOP, or stuck in other work) longer than the timeout.
DTORCH_TEST_WORKER(comm_stall) {
  choose_path(args);
  setenv("DTORCH_TIMEOUT", "2", 1);
  auto c = Communicator::from_env();
  if (c->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  allreduce_expecting_failure(*c, args.at(0), "stall test");
}

TEST_P(CommunicatorPath, StalledRankIsNamedWithinTimeout) {
  std::string dir = testing::scratch_dir("comm_stall");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(testing::run_ranks(2, "comm_stall", {dir, GetParam()}, 60), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("rank(s) 1 did not reach"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stall test"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DTORCH_TIMEOUT"), std::string::npos) << msg;
}

// Rank 1 dies abruptly (no destructors) while rank 0 is in a collective.
DTORCH_TEST_WORKER(comm_dead) {
  choose_path(args);
  setenv("DTORCH_TIMEOUT", "10", 1);
  auto c = Communicator::from_env();
  if (c->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    _exit(0);  // exit 0, so the launcher does not stop rank 0 first
  }
  allreduce_expecting_failure(*c, args.at(0));
}

TEST_P(CommunicatorPath, DeadRankIsNamed) {
  std::string dir = testing::scratch_dir("comm_dead");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(testing::run_ranks(2, "comm_dead", {dir, GetParam()}, 60), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 25);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("rank(s) 1 died"), std::string::npos) << msg;
}

// Rank 1 runs one collective fewer and exits cleanly: rank 0 is told it finished early. Gloo's
// write to rank 1's closed socket must be an error, not SIGPIPE (Note [Broken pipes]): rank 0
// first writes to a closed pipe of its own, so the test fails every time rather than by race.
DTORCH_TEST_WORKER(comm_left) {
  choose_path(args);
  setenv("DTORCH_TIMEOUT", "10", 1);
  auto c = Communicator::from_env();
  if (c->rank() == 1) return;
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe() failed");
  ::close(fds[0]);
  const bool epipe = ::write(fds[1], "x", 1) < 0 && errno == EPIPE;
  ::close(fds[1]);
  if (!epipe) throw std::runtime_error("a write to a closed pipe did not fail with EPIPE");
  allreduce_expecting_failure(*c, args.at(0));
}

TEST_P(CommunicatorPath, RankThatFinishedEarlyIsNamed) {
  std::string dir = testing::scratch_dir("comm_left");
  EXPECT_NE(testing::run_ranks(2, "comm_left", {dir, GetParam()}, 60), 0);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("rank(s) 1 had already finished"), std::string::npos) << msg;
}

// Rank 0 serves the job's store (as LibTorch 1.13's workers do in an elastic round, and under
// torchrun 1.13) and is stopped after the rendezvous: rank 1's allreduce times out, and its
// diagnosis finds the store silent too and says so within its short deadline (Note [Failure
// diagnosis]) rather than the whole window. args: DIR PATH PORT.
DTORCH_TEST_WORKER(comm_store_stopped) {
  choose_path(args);
  setenv("DTORCH_TIMEOUT", "3", 1);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
  setenv("MASTER_PORT", args.at(2).c_str(), 1);
  auto c = Communicator::from_env();
  c->barrier();
  if (c->rank() == 0) {
    ::raise(SIGSTOP);  // the launcher continues and ends it when rank 1 fails
    return;
  }
  allreduce_expecting_failure(*c, args.at(0));
}

TEST(Communicator, StoreServedByAStoppedRankIsNamedSoon) {
  std::string dir = testing::scratch_dir("comm_store_stopped");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(testing::run_ranks(2, "comm_store_stopped",
                               {dir, "gloo", std::to_string(testing::free_port())}, 60),
            0);
  // Rank 1 exits without waiting on the store again (the watchdog would end it 11 s later), and
  // the launcher continues the stopped rank 0 to end it.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 12);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("is unreachable too"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(rank 0) has exited or is stopped"), std::string::npos) << msg;
  const double seconds = seconds_in(msg);
  EXPECT_LT(seconds, 3 + 2 + 1.5) << "the timeout, the store's 2 s, slack; not the 5 s window";
}

// Rank 1 stops itself (SIGSTOP) after the rendezvous: rank 0's allreduce names it as stopped
// (its process on this host is in state T) without the diagnosis window's wait for it.
DTORCH_TEST_WORKER(comm_stopped) {
  choose_path(args);
  setenv("DTORCH_TIMEOUT", "2", 1);
  auto c = Communicator::from_env();
  c->barrier();
  if (c->rank() == 1) {
    ::raise(SIGSTOP);  // the launcher continues and ends it when rank 0 fails
    return;
  }
  allreduce_expecting_failure(*c, args.at(0));
}

TEST_P(CommunicatorPath, StoppedRankIsNamedAsStopped) {
  std::string dir = testing::scratch_dir("comm_stopped");
  EXPECT_NE(testing::run_ranks(2, "comm_stopped", {dir, GetParam()}, 60), 0);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("rank(s) 1 are stopped (SIGSTOP or ^Z)"), std::string::npos) << msg;
  const double seconds = seconds_in(msg);
  // Waiting out the diagnosis window would take 2 + 5 s; the slack is for a loaded machine (make
  // test runs this beside two computing tests).
  EXPECT_LT(seconds, 2 + 4.5) << "the timeout and slack; not the 5 s diagnosis window";
}

// Rank 0 cannot make its Gloo device (an interface that does not exist) and leaves without
// posting its address: rank 1's process group creation fails naming rank 0, whose process is gone.
DTORCH_TEST_WORKER(comm_gloo_missing) {
  setenv("DTORCH_SHM", "0", 1);
  setenv("DTORCH_TIMEOUT", "3", 1);
  if (std::string(std::getenv("RANK")) == "0") {
    setenv("GLOO_SOCKET_IFNAME", "dtorch-noif0", 1);
    try {
      Communicator::from_env();
    } catch (const std::exception&) {
      _exit(0);  // exit 0, so the launcher does not stop rank 1 first
    }
    _exit(2);
  }
  try {
    Communicator::from_env();
  } catch (const CommError& e) {
    std::ofstream(args.at(0) + "/error") << e.what();
    throw;
  }
}

TEST(Communicator, RankMissingFromTheProcessGroupIsNamed) {
  std::string dir = testing::scratch_dir("comm_gloo_missing");
  EXPECT_NE(testing::run_ranks(2, "comm_gloo_missing", {dir}, 60), 0);
  std::string msg = read_file(dir + "/error");
  EXPECT_NE(msg.find("creating the process group failed on rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank(s) 0 (its process on this host is gone) had not posted their Gloo "
                     "address"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("GLOO_SOCKET_IFNAME"), std::string::npos) << msg;
}

// Large tensors cross several shared-memory chunks; odd sizes leave uneven shares.
DTORCH_TEST_WORKER(comm_large) {
  choose_path(args);
  auto c = Communicator::from_env();
  int64_t n = 3 * (4 << 20) / 4 + 12345;  // just over three 4 MiB chunks of float
  auto t = torch::arange(n, torch::kFloat) * float(c->rank() + 1);
  c->allreduce(t, ReduceOp::Sum);
  auto want = torch::arange(n, torch::kFloat) * float(c->size() * (c->size() + 1) / 2);
  DTORCH_CHECK(t.equal(want), "large allreduce differs from the sum computed by hand");
  auto d = torch::full({7}, double(c->rank()), torch::kDouble);
  c->allreduce(d, ReduceOp::Avg);
  DTORCH_CHECK(d[6].item<double>() == (c->size() - 1) / 2.0, "double average is wrong");
}

TEST_P(CommunicatorPath, LargeAndOddSizedTensors) {
  EXPECT_EQ(testing::run_ranks(3, "comm_large", {"unused", GetParam()}), 0);
}

INSTANTIATE_TEST_SUITE_P(Comm, CommunicatorPath, ::testing::Values("shm", "gloo"));

}  // namespace
}  // namespace dtorch::comm
