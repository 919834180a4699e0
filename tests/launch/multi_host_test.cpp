// Several hosts for real: two network namespaces, each with its own address (10.77.0.1 and
// 10.77.0.2 on a veth pair) and its own host name, run one `dtorch launch` each and train four
// ranks together. Needs root and iproute2 (`ip`); skips with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using testing::contains;
using testing::read_file;

int sh(const std::string& script) {
  int rc = std::system(("/bin/sh -c '" + script + "' >/dev/null 2>&1").c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

// Two namespaces joined by a veth pair; removed again however the test ends.
class TwoHosts {
 public:
  TwoHosts() {
    std::string id = std::to_string(::getpid());
    ns_ = {"dtorch-h0-" + id, "dtorch-h1-" + id};
    std::string va = "dtv" + id + "a", vb = "dtv" + id + "b";  // interface names: 15 chars max
    setup_ = "set -e; ip netns add " + ns_[0] + "; ip netns add " + ns_[1] + "; ip link add " + va +
             " type veth peer name " + vb + "; ip link set " + va + " netns " + ns_[0] +
             "; ip link set " + vb + " netns " + ns_[1] + "; ip -n " + ns_[0] +
             " addr add 10.77.0.1/24 dev " + va + "; ip -n " + ns_[1] +
             " addr add 10.77.0.2/24 dev " + vb + "; for n in " + ns_[0] + " " + ns_[1] +
             "; do ip -n $n link set lo up; done; ip -n " + ns_[0] + " link set " + va +
             " up; ip -n " + ns_[1] + " link set " + vb + " up";
    ok_ = sh(setup_) == 0;
  }
  ~TwoHosts() {
    for (const auto& n : ns_)
      sh("ip netns del " + n);  // takes its end of the veth pair, and so the pair, with it
  }
  bool ok() const { return ok_; }
  const std::string& setup() const { return setup_; }
  const std::string& ns(int i) const { return ns_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<std::string> ns_;
  std::string setup_;
  bool ok_ = false;
};

TEST(MultiHost, TwoNamespacesTrainFourRanksTogether) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces (ip netns)";
  if (sh("command -v ip && command -v unshare") != 0) {
    GTEST_SKIP() << "needs `ip` (Debian package iproute2) and `unshare` (util-linux)";
  }
  TwoHosts hosts;
  if (!hosts.ok()) {
    GTEST_SKIP() << "cannot create network namespaces here (a container without "
                    "CAP_NET_ADMIN/CAP_SYS_ADMIN?); tried: "
                 << hosts.setup();
  }
  std::string dir = testing::scratch_dir("multi-host");
  std::string id = std::to_string(::getpid());
  std::vector<std::string> names = {"dtorch-a" + id, "dtorch-b" + id};
  std::vector<testing::Command> nodes;
  for (int node = 0; node < 2; ++node) {
    // ip netns exec gives the network; unshare --uts a host name of its own.
    std::vector<std::string> argv = {
        "/bin/sh",
        "-c",
        "exec ip netns exec \"$0\" unshare --uts sh -c 'hostname \"$0\" && exec \"$@\"' \"$@\"",
        hosts.ns(node),
        names[static_cast<std::size_t>(node)],
        DTORCH_CLI,
        "launch",
        "--nnodes",
        "2",
        "--node-rank",
        std::to_string(node),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "10.77.0.1",
        "--master-port",
        "29500",
        "--rdzv-timeout",
        "30",
        "--timeout",
        "120",
        "--log-dir",
        dir + "/logs",
        "--",
        "sh",
        "-c",
        "echo rank $RANK of $WORLD_SIZE on $(hostname); exec \"$@\"",
        "sh",
        DTORCH_CLI,
        "train",
        "--model",
        "mnist-mlp",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--train-samples",
        "2048",
        "--test-samples",
        "1000",
        "--progress",
        "off",
        "--out",
        dir + "/run"};
    nodes.push_back(testing::start_command(
        testing::scratch_dir("multi-host-" + std::to_string(node)), argv, {"DTORCH_TIMEOUT=60"}));
  }
  std::vector<testing::CommandResult> r;
  for (const auto& n : nodes)
    r.push_back(testing::finish_command(n, 150));
  for (int node = 0; node < 2; ++node) {
    SCOPED_TRACE("node " + std::to_string(node));
    const auto& res = r[static_cast<std::size_t>(node)];
    ASSERT_EQ(res.exit_code(), 0) << res.out << res.err;
    const std::string& h = names[static_cast<std::size_t>(node)];
    for (int local = 0; local < 2; ++local) {
      int rank = 2 * node + local;
      std::string line = "[" + h + " n" + std::to_string(node) + " r" + std::to_string(rank) +
                         "] rank " + std::to_string(rank) + " of 4 on " + h + "\n";
      EXPECT_TRUE(contains(res.out, line)) << line << " not in\n" << res.out;
      std::string log = read_file(dir + "/logs/rank" + std::to_string(rank) + ".log");
      EXPECT_TRUE(contains(log, "rank " + std::to_string(rank) + " of 4 on " + h)) << log;
    }
  }
  EXPECT_TRUE(contains(r[0].err, "all 2 nodes arrived (n0 " + names[0] + ", n1 " + names[1] + ")"))
      << r[0].err;
  EXPECT_TRUE(contains(r[0].err, "[" + names[0] + " n0 r0] dtorch info: training mnist-mlp"))
      << r[0].err;
  EXPECT_TRUE(contains(r[0].err, "4 rank(s) x batch 32")) << r[0].err;
  std::string m = read_file(dir + "/run/metrics.jsonl");
  ASSERT_FALSE(m.empty());
  auto epoch = nlohmann::json::parse(m.substr(0, m.find('\n')));
  EXPECT_GT(epoch["test_accuracy"].get<double>(), 0.3) << m;
}

}  // namespace
}  // namespace dtorch::launch
