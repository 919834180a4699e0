// Several hosts for real: two network namespaces (launch/namespace_hosts.h), each with its own
// address (10.77.0.1 and 10.77.0.2) and host name, run one `dtorch launch` each and train four
// ranks together. Needs root and iproute2 (`ip`); skips with the reason otherwise.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/namespace_hosts.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using testing::contains;
using testing::read_file;

TEST(MultiHost, TwoNamespacesTrainFourRanksTogether) {
  testing::NamespaceHosts hosts(2, 77);
  if (!hosts.unavailable().empty()) GTEST_SKIP() << hosts.unavailable();
  std::string dir = testing::scratch_dir("multi-host");
  std::vector<std::string> names = {hosts.name(0), hosts.name(1)};
  std::vector<testing::Command> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv =
        hosts.on(node, {DTORCH_CLI,
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
                        dir + "/run"});
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
