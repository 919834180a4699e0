// `dtorch launch --rdzv-backend c10d` for real: on one host next to PyTorch's own torchrun (same
// flags, same worker environment), and on hosts made of network namespaces
// (launch/namespace_hosts.h): three hosts with --nnodes 2:3 lose one mid-training and finish on
// two, with the accuracy of an uninterrupted run (--global-batch-size keeps the optimizer's
// steps when the world size changes); with --nnodes 3:3 the job fails in seconds
// naming the lost host; two hosts give workers the environment torchrun gives them there.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtorch/core/error.h"
#include "dtorch/launch/store.h"
#include "launch/namespace_hosts.h"
#include "models/python_peer.h"
#include "support/command.h"
#include "support/train_run.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using testing::contains;
using testing::read_file;

// Prints the worker's torchrun variables as one JSON line, with its host name.
const char* kEnvDump = R"PY(
import json, os, socket
keys = sorted(k for k in os.environ if k.startswith(
    ("TORCHELASTIC", "GROUP_", "ROLE_", "RANK", "LOCAL_", "WORLD", "MASTER", "TORCH_", "OMP")))
# One write(2) per line (under PIPE_BUF, so atomic): print() may write the text and its newline
# apart, and two workers sharing the launcher's stdout then interleave their lines.
line = "ENV " + json.dumps({"host": socket.gethostname(), "env": {k: os.environ[k] for k in keys}})
os.write(1, (line + "\n").encode())
)PY";

// The workers' environments from a launcher's output, by global rank.
std::map<int, json> envs_of(const std::string& out) {
  std::map<int, json> by_rank;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    auto at = line.find("ENV {");
    if (at == std::string::npos) continue;
    json j = json::parse(line.substr(at + 4));
    by_rank[std::stoi(j["env"]["RANK"].get<std::string>())] = j;
  }
  return by_rank;
}

// Torchrun's rank variables agree with each other, and on several hosts MASTER_ADDR names node
// 0's host.
void expect_consistent(const std::map<int, json>& envs, const std::string& who) {
  SCOPED_TRACE(who);
  std::string node0;
  std::set<std::string> hosts;
  for (const auto& [rank, j] : envs) {
    hosts.insert(j["host"].get<std::string>());
    if (j["env"]["GROUP_RANK"] == "0") node0 = j["host"];
  }
  for (const auto& [rank, j] : envs) {
    const json& e = j["env"];
    int group = std::stoi(e["GROUP_RANK"].get<std::string>());
    int local = std::stoi(e["LOCAL_RANK"].get<std::string>());
    int per_node = std::stoi(e["LOCAL_WORLD_SIZE"].get<std::string>());
    EXPECT_EQ(rank, group * per_node + local) << j;
    EXPECT_EQ(e["ROLE_RANK"], e["RANK"]) << j;
    if (hosts.size() > 1) EXPECT_EQ(e["MASTER_ADDR"].get<std::string>(), node0) << j;
  }
}

// The same variables with the same values, but for those that differ by nature (ports, paths)
// or by arrival order (which host became node 0).
void expect_same_environment(const std::map<int, json>& torchrun,
                             const std::map<int, json>& dtorch) {
  ASSERT_EQ(torchrun.size(), dtorch.size());
  expect_consistent(torchrun, "torchrun");
  expect_consistent(dtorch, "dtorch launch");
  auto canonical = [](const std::map<int, json>& envs) {
    std::multiset<std::string> out;
    for (const auto& [rank, j] : envs) {
      json e = j["env"];
      for (const char* k : {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "RANK", "ROLE_RANK",
                            "GROUP_RANK", "MASTER_ADDR"}) {
        if (e.contains(k)) e[k] = "<varies>";
      }
      out.insert(e.dump());
    }
    return out;
  };
  EXPECT_EQ(canonical(torchrun), canonical(dtorch));
}

std::vector<std::string> c10d_flags(const std::string& nnodes, const std::string& endpoint) {
  return {"--nnodes",        nnodes,   "--nproc_per_node", "2",
          "--rdzv_id",       "4711",   "--rdzv_backend",   "c10d",
          "--rdzv_endpoint", endpoint, "--rdzv_conf",      "last_call_timeout=1"};
}

TEST(ElasticPyTorch, OneHostWorkersSeeWhatTorchrunGivesThem) {
  DTORCH_SKIP_WITHOUT_PYTHON(true);
  std::string dir = testing::scratch_dir("elastic-env-one-host");
  std::ofstream(dir + "/env.py") << kEnvDump;
  std::string endpoint = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<std::string> torchrun = testing::torchrun_command();
  for (const auto& f : c10d_flags("1:2", endpoint))
    torchrun.push_back(f);
  torchrun.push_back(dir + "/env.py");
  auto theirs = testing::run_command("elastic-env-torchrun", torchrun, 90);
  ASSERT_EQ(theirs.exit_code(), 0) << theirs.out << theirs.err;

  std::vector<std::string> ours = {DTORCH_CLI, "launch"};
  for (const auto& f : c10d_flags("1:2", endpoint))
    ours.push_back(f);
  for (const auto& a : {std::string("--"), testing::python(), dir + "/env.py"})
    ours.push_back(a);
  auto mine = testing::run_command("elastic-env-dtorch", ours, 90);
  ASSERT_EQ(mine.exit_code(), 0) << mine.out << mine.err;
  EXPECT_TRUE(contains(mine.err, "round 0: 1 node(s) (n0 ")) << mine.err;
  auto a = envs_of(theirs.out), b = envs_of(mine.out);
  ASSERT_EQ(a.size(), 2u) << theirs.out;
  expect_same_environment(a, b);
  for (int r = 0; r < 2; ++r)  // one host: node 0 everywhere, so every value but the port's
    EXPECT_EQ(a[r]["env"]["MASTER_ADDR"], b[r]["env"]["MASTER_ADDR"]);
}

TEST(ElasticLaunch, TorchrunFlagsNeedWhatTheyName) {
  auto r = testing::run_command("elastic-flags-1",
                                {DTORCH_CLI, "launch", "--rdzv_backend", "c10d", "--", "true"}, 20);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]")) << r.err;
  EXPECT_FALSE(contains(r.err, ".cpp:")) << "a user's error names no source file: " << r.err;
  r = testing::run_command("elastic-flags-2",
                           {DTORCH_CLI, "launch", "--nnodes", "2:3", "--", "true"}, 20);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(contains(r.err, "--nnodes=2:3 is an elastic range, which needs --rdzv-backend c10d"))
      << r.err;
  r = testing::run_command("elastic-flags-3",
                           {DTORCH_CLI, "launch", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                            "h:1", "--rdzv-conf", "join_timout=3", "--", "true"},
                           20);
  EXPECT_TRUE(contains(r.err, "--rdzv-conf: unknown key 'join_timout'")) << r.err;
  r = testing::run_command("elastic-flags-4", {DTORCH_CLI, "launch", "--bogus", "x"}, 20);
  EXPECT_TRUE(contains(r.err, "unknown flag --bogus")) << r.err;
  EXPECT_FALSE(contains(r.err, "[tools/")) << r.err;
}

// Three launchers on this host: the first two start a round of two, the third comes later,
// waits, and joins at the next round, where everyone is renumbered (up to MAX = 3). The job
// ends when its workers do: the launcher serving the job's store and the last round's node 0
// (another launcher) each keep a store up for the others, and neither waits for the other to
// leave (they once did, until close_timeout).
TEST(ElasticLaunch, ALateNodeJoinsAtTheNextRound) {
  const auto started = std::chrono::steady_clock::now();
  std::string endpoint = "127.0.0.1:" + std::to_string(testing::free_port());
  auto start = [&](int i) {
    return testing::start_command(
        testing::scratch_dir("elastic-late-" + std::to_string(i)),
        {DTORCH_CLI, "launch", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         endpoint, "--rdzv-conf", "last_call_timeout=1,keep_alive_interval=1,close_timeout=60",
         "--timeout", "90", "--", "sh", "-c",
         "echo rank $RANK of $WORLD_SIZE in round $DTORCH_ELASTIC_ROUND; "
         "[ $WORLD_SIZE = 3 ] && sleep 2 || sleep 30"});
  };
  std::vector<testing::Command> early = {start(0), start(1)};
  testing::wait_until([&] { return contains(read_file(early[0].dir + "/stdout"), " of 2"); }, 30);
  testing::Command late = start(2);
  std::vector<testing::CommandResult> r = {testing::finish_command(early[0], 90),
                                           testing::finish_command(early[1], 90),
                                           testing::finish_command(late, 90)};
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 40) << "the launchers waited for each other's close_timeout (60 s)";
  std::string all;
  for (const auto& x : r) {
    EXPECT_EQ(x.exit_code(), 0) << x.out << x.err;
    all += x.out + x.err;
  }
  EXPECT_TRUE(contains(r[0].err, "round 0: 2 node(s)")) << r[0].err;
  EXPECT_TRUE(contains(r[0].err, "asks to join the 2 running, up to 3")) << r[0].err;
  EXPECT_FALSE(contains(r[2].err, "round 0:")) << "the late node is in no round 0: " << r[2].err;
  for (const auto& x : r)
    EXPECT_TRUE(contains(x.err, "round 1: 3 node(s)")) << x.err;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(contains(all, "rank " + std::to_string(rank) + " of 3 in round 1")) << all;
}

// Note [One job per store]: a launcher of another job given the same endpoint, and a worker
// started for another job, are refused with both jobs named while the job waits for its second
// node; neither joins it, and the job then runs on its own two nodes.
TEST(ElasticLaunch, ALauncherOrWorkerOfAnotherJobIsRefusedAndNeverJoins) {
  const int port = testing::free_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto launcher = [&](const std::string& job, int i) {
    return testing::start_command(
        testing::scratch_dir("other-job-" + job + std::to_string(i)),
        {DTORCH_CLI, "launch", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         endpoint, "--rdzv-id", job, "--rdzv-conf", "join_timeout=60", "--timeout", "60", "--",
         "sh", "-c", "echo rank $RANK of $WORLD_SIZE in job $TORCHELASTIC_RUN_ID"});
  };
  testing::Command first = launcher("jobA", 0);
  // Its store is claimed once it serves (launch/store.h).
  ASSERT_TRUE(testing::wait_until(
      [&] {
        try {
          return testing::listening(port) &&
                 connect_store("127.0.0.1", port, std::chrono::seconds(1))->check({"dtorch/job"});
        } catch (const CommError&) {
          return false;
        }
      },
      30))
      << read_file(first.dir + "/stderr");

  const auto stray = testing::finish_command(launcher("jobB", 0), 30);
  EXPECT_NE(stray.exit_code(), 0) << stray.err;
  EXPECT_TRUE(contains(stray.err, "belongs to job 'jobA', not to this launcher's job 'jobB'"))
      << stray.err;
  EXPECT_FALSE(contains(stray.out, "rank ")) << "a worker of the stray ran: " << stray.out;

  const auto worker =
      testing::run_second_worker("other-job-worker", port, 30, {"TORCHELASTIC_RUN_ID=jobB"});
  EXPECT_EQ(worker.exit_code(), 1) << worker.err;
  EXPECT_TRUE(contains(worker.err,
                       "belongs to job 'jobA', but this worker's TORCHELASTIC_RUN_ID "
                       "is 'jobB'"))
      << worker.err;

  testing::Command second = launcher("jobA", 1);
  const auto r0 = testing::finish_command(first, 90);
  const auto r1 = testing::finish_command(second, 60);
  EXPECT_EQ(r0.exit_code(), 0) << r0.err;
  EXPECT_EQ(r1.exit_code(), 0) << r1.err;
  const std::string all = r0.out + r1.out;
  EXPECT_TRUE(contains(all, "rank 0 of 2 in job jobA")) << all;
  EXPECT_TRUE(contains(all, "rank 1 of 2 in job jobA")) << all;
  EXPECT_FALSE(contains(all, "jobB")) << all;
}

// ---- several hosts --------------------------------------------------------------------------

class ElasticHosts : public ::testing::Test {
 protected:
  void make_hosts(int n, int net) {
    hosts_ = std::make_unique<testing::NamespaceHosts>(n, net);
    if (!hosts_->unavailable().empty()) GTEST_SKIP() << hosts_->unavailable();
  }
  // `dtorch launch` on host i with an elastic range, training into `out`: three epochs of 250
  // small steps, long enough to lose a host inside the second.
  testing::Command start_training(int i, const std::string& nnodes, const std::string& out,
                                  const std::string& tag) {
    std::vector<std::string> argv = {DTORCH_CLI,
                                     "launch",
                                     "--nnodes",
                                     nnodes,
                                     "--nproc-per-node",
                                     "1",
                                     "--rdzv-backend",
                                     "c10d",
                                     "--rdzv-endpoint",
                                     hosts_->address(0) + ":29400",
                                     "--rdzv-id",
                                     tag,
                                     "--rdzv-conf",
                                     "keep_alive_interval=1,keep_alive_max_attempt=3,"
                                     "last_call_timeout=10,join_timeout=60",
                                     "--max-restarts",
                                     "3",
                                     "--grace-period",
                                     "1",
                                     "--timeout",
                                     "240",
                                     "--",
                                     DTORCH_CLI,
                                     "train",
                                     "--model",
                                     "mnist-mlp",
                                     "--epochs",
                                     "3",
                                     "--train-samples",
                                     "6000",
                                     "--test-samples",
                                     "1000",
                                     "--seed",
                                     "7",
                                     "--progress",
                                     "lines",
                                     "--global-batch-size",
                                     "24",
                                     "--resume",
                                     "--threads",
                                     "1",
                                     "--out",
                                     out};
    return testing::start_command(testing::scratch_dir(tag + "-h" + std::to_string(i)),
                                  hosts_->on(i, argv), {"DTORCH_TIMEOUT=30"});
  }
  std::unique_ptr<testing::NamespaceHosts> hosts_;
};

using testing::wait_for_file;

TEST_F(ElasticHosts, ThreeHostsLoseOneAndFinishOnTwo) {
  make_hosts(3, 78);
  std::string dir = testing::scratch_dir("elastic-lose-one");
  // The uninterrupted run.
  std::vector<testing::Command> whole;
  for (int i = 0; i < 3; ++i)
    whole.push_back(start_training(i, "2:3", dir + "/whole", "elastic-whole"));
  for (int i = 0; i < 3; ++i) {
    auto r = testing::finish_command(whole[static_cast<std::size_t>(i)], 240);
    ASSERT_EQ(r.exit_code(), 0) << "host " << i << "\n" << r.out << r.err;
    if (i == 0) EXPECT_TRUE(contains(r.err, "round 0: 3 node(s)")) << r.err;
  }

  std::vector<testing::Command> run;
  for (int i = 0; i < 3; ++i)
    run.push_back(start_training(i, "2:3", dir + "/lost", "elastic-lost"));
  // Host 2's launcher dies (its workers with it) once epoch 1's checkpoint exists.
  bool saved = wait_for_file(dir + "/lost/checkpoint-000001.dtc", 180);
  ASSERT_EQ(::kill(run[2].pid, SIGKILL), 0);
  ASSERT_TRUE(saved);
  auto killed_at = Clock::now();
  std::vector<testing::CommandResult> r;
  for (int i = 0; i < 3; ++i)
    r.push_back(testing::finish_command(run[static_cast<std::size_t>(i)], 240));
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("host " + std::to_string(i));
    const std::string& err = r[static_cast<std::size_t>(i)].err;
    ASSERT_EQ(r[static_cast<std::size_t>(i)].exit_code(), 0) << err;
    EXPECT_TRUE(contains(err, "round 0: 3 node(s)")) << err;
    EXPECT_TRUE(contains(err, "round 1: 2 node(s)")) << err;
    EXPECT_TRUE(contains(err, "ends: ")) << err;
    EXPECT_FALSE(contains(err, hosts_->name(2) + "; this node")) << "host 2 is not in round 1";
  }
  (void)killed_at;
  // Round 1 numbered the two hosts left 0 and 1 and resumed from the checkpoint.
  std::string both = r[0].err + r[1].err;
  EXPECT_TRUE(contains(both, "this node is n0, ranks 0..0 of 2")) << both;
  EXPECT_TRUE(contains(both, "this node is n1, ranks 1..1 of 2")) << both;
  EXPECT_TRUE(contains(both, "resuming from " + dir + "/lost/checkpoint-00000")) << both;
  auto a = testing::epochs_of(dir + "/whole"), b = testing::epochs_of(dir + "/lost");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.back()["epoch"], 2);
  double acc_whole = a.back()["test_accuracy"], acc_lost = b.back()["test_accuracy"];
  EXPECT_NEAR(acc_lost, acc_whole, 0.005);
  EXPECT_GT(acc_whole, 0.6);
}

TEST_F(ElasticHosts, AFixedSizeJobFailsInSecondsNamingTheLostHost) {
  make_hosts(3, 79);
  std::string dir = testing::scratch_dir("elastic-fixed");
  std::vector<testing::Command> run;
  for (int i = 0; i < 3; ++i)
    run.push_back(start_training(i, "3:3", dir + "/run", "elastic-fixed"));
  bool saved = wait_for_file(dir + "/run/checkpoint-000001.dtc", 180);
  ASSERT_EQ(::kill(run[2].pid, SIGKILL), 0);
  ASSERT_TRUE(saved);
  auto killed_at = Clock::now();
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("host " + std::to_string(i));
    auto r = testing::finish_command(run[static_cast<std::size_t>(i)], 60);
    double took = testing::seconds_since(killed_at);
    EXPECT_NE(r.exit_code(), 0) << r.err;
    EXPECT_LT(took, 30) << r.err;
    EXPECT_TRUE(contains(r.err, hosts_->name(2))) << r.err;
    EXPECT_TRUE(contains(r.err, "fewer than --nnodes MIN 3")) << r.err;
  }
  testing::finish_command(run[2], 10);
}

TEST_F(ElasticHosts, TwoHostsWorkersSeeWhatTorchrunGivesThem) {
  DTORCH_SKIP_WITHOUT_PYTHON(true);
  make_hosts(2, 80);
  std::string dir = testing::scratch_dir("elastic-env-two-hosts");
  std::ofstream(dir + "/env.py") << kEnvDump;
  std::string endpoint = hosts_->address(0) + ":29400";
  auto run_both = [&](const std::vector<std::string>& head, bool ours, const std::string& tag) {
    std::vector<testing::Command> c;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv = head;
      for (const auto& f : c10d_flags("2", endpoint))
        argv.push_back(f);
      if (ours) argv.push_back("--");
      if (ours) argv.push_back(testing::python());
      argv.push_back(dir + "/env.py");
      c.push_back(testing::start_command(testing::scratch_dir(tag + std::to_string(i)),
                                         hosts_->on(i, argv)));
    }
    std::map<int, json> envs;
    for (int i = 0; i < 2; ++i) {
      auto r = testing::finish_command(c[static_cast<std::size_t>(i)], 90);
      EXPECT_EQ(r.exit_code(), 0) << tag << " host " << i << "\n" << r.out << r.err;
      auto more = envs_of(r.out);
      envs.insert(more.begin(), more.end());
    }
    return envs;
  };
  auto theirs = run_both(testing::torchrun_command(), false, "elastic-env2-torchrun");
  std::vector<std::string> head = {DTORCH_CLI, "launch"};
  auto mine = run_both(head, true, "elastic-env2-dtorch");
  ASSERT_EQ(theirs.size(), 4u);
  expect_same_environment(theirs, mine);
  std::set<std::string> masters;
  for (const auto& [rank, j] : mine)
    masters.insert(j["env"]["MASTER_ADDR"]);
  EXPECT_EQ(masters.size(), 1u);
  EXPECT_TRUE(masters.count(hosts_->name(0)) || masters.count(hosts_->name(1)));
}

}  // namespace
}  // namespace dtorch::launch
