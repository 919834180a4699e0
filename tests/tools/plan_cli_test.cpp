// `dtorch plan` from a machine file: one JSON line per layout, ranked fitting first and then by
// predicted step time, each with its flags; bad flags and files named. `dtorch plan calibrate`
// on 2 ranks writes a machine file that plan reads (a GPT and a CNN) and validates a layout with,
// and never overwrites one. Calibrations here are --quick ones (tiny sizes, one round): the same
// measurements and the same file, in seconds.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtorch/core/device.h"
#include "dtorch/core/paths.h"
#include "dtorch/plan/machine.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

std::string round_machine_file(const std::string& dir) {
  plan::Machine m;
  m.name = "round";
  m.ranks_per_node = 4;
  m.memory_per_rank_bytes = 2.0 * (1 << 30);
  m.matmul_flops["fp32"] = 1e10;
  m.adamw_seconds_per_parameter = 1e-9;
  for (plan::Collective c : {plan::Collective::AllReduce, plan::Collective::ReduceScatter,
                             plan::Collective::AllGather, plan::Collective::P2P})
    m.intra_node[c] = {{2, 1e-5, 1e9}};
  const std::string path = dir + "/machine.json";
  std::ofstream(path) << plan::machine_json(m);
  return path;
}

// `dtorch plan --validate 1` of gpt-debug at a global batch of 4 on `machine`, with `flags`: the
// first layout's JSON line (with what it measured), or null after a failure the test reports.
nlohmann::json validated_first(const std::string& name, const std::string& machine,
                               const std::vector<std::string>& flags) {
  std::vector<std::string> args{
      DTORCH_CLI, "plan",      "--model",    "gpt-debug", "--global-batch-size",
      "4",        "--machine", machine,      "--format",  "json",
      "--top",    "1",         "--validate", "1",         "--validate-steps",
      "1"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = testing::run_command(name, args, 180);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  if (r.exit_code() != 0) return nullptr;
  return nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
}

TEST(PlanCli, RanksEveryLayoutAsJsonLines) {
  const std::string dir = testing::scratch_dir("plan_cli");
  const std::string machine = round_machine_file(dir);
  auto r = testing::run_command(
      "plan_json",
      {DTORCH_CLI, "plan", "--model", "gpt-small", "--nproc-per-node", "4", "--global-batch-size",
       "8", "--seq-len", "64", "--machine", machine, "--format", "json", "--top", "1000"},
      60);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::istringstream lines(r.out);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);)
    rows.push_back(nlohmann::json::parse(line));
  ASSERT_GT(rows.size(), 20u);
  bool some_do_not_fit = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const char* key : {"flags", "predicted_step_s", "predicted_peak_gib", "fits"})
      ASSERT_TRUE(rows[i].contains(key)) << key << " in " << rows[i].dump();
    const nlohmann::json& row = rows[i];
    EXPECT_NEAR(
        row["predicted_step_s"].get<double>(),
        row["predicted_compute_s"].get<double>() + row["predicted_exposed_comm_s"].get<double>() +
            row["predicted_bubble_s"].get<double>() + row["predicted_offload_s"].get<double>(),
        1e-9);
    EXPECT_EQ(
        row["dp"].get<int>() * row["tp"].get<int>() * row["pp"].get<int>() * row["cp"].get<int>(),
        4);
    some_do_not_fit |= !row["fits"].get<bool>();
    if (i == 0) continue;
    const nlohmann::json& before = rows[i - 1];
    if (before["fits"] == row["fits"]) {
      EXPECT_LE(before["predicted_step_s"].get<double>(), row["predicted_step_s"].get<double>());
    } else {
      EXPECT_TRUE(before["fits"].get<bool>()) << "a layout that fits after one that does not";
    }
  }
  // gpt-small's ddp state alone (16 bytes a parameter) is over 2 GiB.
  EXPECT_TRUE(some_do_not_fit);
  // --strategy keeps the layouts of the strategies named, in the same order.
  auto sharded =
      testing::run_command("plan_json_zero",
                           {DTORCH_CLI, "plan", "--model", "gpt-small", "--nproc-per-node", "4",
                            "--global-batch-size", "8", "--seq-len", "64", "--machine", machine,
                            "--format", "json", "--top", "1000", "--strategy", "zero3,zero1"},
                           60);
  ASSERT_EQ(sharded.exit_code(), 0) << sharded.err;
  std::vector<std::string> kept, expected;
  std::istringstream sharded_lines(sharded.out);
  for (std::string line; std::getline(sharded_lines, line);)
    kept.push_back(nlohmann::json::parse(line)["flags"]);
  for (const nlohmann::json& row : rows) {
    const std::string flags = row["flags"];
    if (testing::contains(flags, "--strategy zero3") ||
        testing::contains(flags, "--strategy zero1"))
      expected.push_back(flags);
  }
  EXPECT_FALSE(kept.empty());
  EXPECT_EQ(kept, expected);
  auto table =
      testing::run_command("plan_table",
                           {DTORCH_CLI, "plan", "--model", "gpt-small", "--nproc-per-node", "4",
                            "--global-batch-size", "8", "--seq-len", "64", "--machine", machine,
                            "--memory-per-rank", "0.5", "--top", "5", "--out", dir + "/plan.svg"},
                           60);
  ASSERT_EQ(table.exit_code(), 0) << table.err;
  const std::string svg = testing::read_file(dir + "/plan.svg");
  EXPECT_TRUE(testing::contains(svg, "<svg")) << svg.substr(0, 200);
  EXPECT_TRUE(testing::contains(svg, "#5")) << svg;  // a bar per layout shown
  EXPECT_TRUE(testing::contains(svg, "exposed communication")) << svg;
  EXPECT_TRUE(testing::contains(table.out, "(does not fit: over by")) << table.out;
  EXPECT_TRUE(testing::contains(table.out, "0.50 GiB per rank")) << table.out;
}

TEST(PlanCli, BadFlagsAndFilesAreNamed) {
  const std::string dir = testing::scratch_dir("plan_bad");
  const std::string machine = round_machine_file(dir);
  // A machine file whose name a picture could take.
  const std::string svg_named = dir + "/machine.svg";
  { std::ofstream(svg_named) << testing::read_file(machine); }
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : {
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2"},
                "needs --machine FILE"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--gpus-per-node", "2",
                 "--global-batch-size", "2", "--machine", machine},
                "give the ranks per node once"},
           Case{{"--model", "resnet19", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine},
                "unknown model 'resnet19': choose one of"},
           Case{{"--model", "resnet-debug", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--seq-len", "64", "--machine", machine},
                "takes images: drop --seq-len"},
           Case{{"--model", "vit-debug", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--seq-len", "64", "--machine", machine},
                "takes its tokens from its images: drop --seq-len"},
           Case{{"--model", "vit-debug", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine},
                "has no convolution rate for fp32 (it has none): calibrate it again"},
           Case{{"--model", "gpt-debug", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", svg_named, "--out", dir + "/./machine.svg"},
                "is the --machine file this plan reads"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", dir + "/none.json"},
                "no such file"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine, "--strategy", "zero1,zero4"},
                "--strategy zero4 is not a strategy: give ddp, zero1, zero2 or zero3"},
           Case{{"--model", "gpt-small", "--nodes", "2", "--gpus-per-node", "4",
                 "--global-batch-size", "8", "--machine", machine},
                "no inter_node.allreduce measurement"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine, "--offload-optimizer", "nvme"},
                "has no offload_disk rates: calibrate with dtorch plan calibrate --offload-dir"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine, "--dp-replicate", "0"},
                "--dp-replicate must be >= 1 (got 0)"},
           Case{{"--model", "gpt-small", "--nproc-per-node", "2", "--global-batch-size", "2",
                 "--machine", machine, "--dp-replicate", "2"},
                "or another --strategy or --dp-replicate (replicas are one a node of several)"},
           Case{{"calibrate", "--out", dir + "/m.json", "--offload-dir", dir + "/absent"},
                "--offload-dir " + dir + "/absent is not a folder"},
       }) {
    std::vector<std::string> args{DTORCH_CLI, "plan"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto r = testing::run_command("plan_bad_run", args, 60);
    EXPECT_NE(r.exit_code(), 0) << c.says;
    EXPECT_TRUE(testing::contains(r.err, c.says)) << r.err;
    EXPECT_FALSE(testing::contains(r.err, ".cpp:")) << r.err;
  }
}

TEST(PlanCalibrate, WritesAMachineFileThePlanReadsAndNeverOverwritesOne) {
  const std::string dir = testing::scratch_dir("plan_calibrate");
  const std::string out = dir + "/machine.json", nvme = testing::scratch_dir("plan_nvme");
  auto r = testing::run_command("plan_calibrate",
                                {DTORCH_CLI, "plan", "calibrate", "--out", out, "--nproc-per-node",
                                 "2", "--quick", "--offload-dir", nvme},
                                120);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const plan::Machine m = plan::read_machine(out);
  // The offload folder's disk, where the layouts' flags will name it.
  EXPECT_TRUE(m.offload_disk.measured());
  EXPECT_EQ(m.offload_disk.dir, nvme);
  EXPECT_TRUE(paths::list_directory(nvme).empty());
  EXPECT_EQ(m.ranks_per_node, 2);
  EXPECT_GT(m.flops("fp32"), 1e8);
  EXPECT_GT(m.adamw_seconds_per_parameter, 0);
  EXPECT_GT(m.memory_per_rank_bytes, 0);
  EXPECT_GT(m.seconds(plan::Collective::AllReduce, 2, 1e6, false), 0);
  EXPECT_GT(m.seconds(plan::Collective::P2P, 2, 1e6, false), 0);
  // The rate by rows, fewest first, and the first touch of fresh memory, on this CPU.
  EXPECT_EQ(m.device, "cpu");
  ASSERT_GE(m.matmul_by_rows.at("fp32").size(), 3u);
  for (size_t i = 1; i < m.matmul_by_rows.at("fp32").size(); ++i)
    EXPECT_LT(m.matmul_by_rows.at("fp32")[i - 1].rows, m.matmul_by_rows.at("fp32")[i].rows);
  EXPECT_GT(m.flops("fp32", 64), 1e8);
  EXPECT_GT(m.convolution_flops("fp32"), 1e8);
  EXPECT_GE(m.first_touch_seconds_per_byte, 0);
  // Ring attention over the two ranks, and the two in lockstep.
  EXPECT_GT(m.ring_attention.step_seconds + m.ring_attention.seconds_per_score, 0);
  EXPECT_GT(m.ring_attention.forward_share, 0);
  EXPECT_LT(m.ring_attention.forward_share, 1);
  EXPECT_GE(m.lockstep_fraction, 0);
  auto plan = testing::run_command("plan_calibrated",
                                   {DTORCH_CLI, "plan", "--model", "gpt-debug", "--nproc-per-node",
                                    "2", "--global-batch-size", "4", "--machine", out},
                                   60);
  EXPECT_EQ(plan.exit_code(), 0) << plan.err;
  // A CNN is measured in the plan's own process, its convolutions at the calibrated rate.
  auto cnn =
      testing::run_command("plan_cnn",
                           {DTORCH_CLI, "plan", "--model", "resnet-debug", "--nproc-per-node", "2",
                            "--global-batch-size", "4", "--machine", out},
                           60);
  EXPECT_EQ(cnn.exit_code(), 0) << cnn.err;
  EXPECT_TRUE(testing::contains(cnn.out, "resnet-debug, 1 x 28 x 28 images")) << cnn.out;
  EXPECT_TRUE(testing::contains(cnn.out, "--activation-checkpointing 1")) << cnn.out;
  // --validate runs the layout predicted fastest here and reports what it measured, and how much
  // of the machine other processes took meanwhile (Note [Others on the machine]).
  const nlohmann::json first = validated_first("plan_validated", out, {"--nproc-per-node", "2"});
  ASSERT_FALSE(first.is_null());
  EXPECT_GT(first.at("measured_step_s").get<double>(), 0) << first;
  EXPECT_GT(first.at("measured_peak_gib").get<double>(), 0) << first;
  EXPECT_GE(first.at("measured_others_cpu_share").get<double>(), 0) << first;
  EXPECT_LE(first.at("measured_others_cpu_share").get<double>(), 1) << first;
  // And a layout with the optimizer's state on disk, as its flags run it.
  const nlohmann::json disk = validated_first(
      "plan_validated_offload", out,
      {"--nproc-per-node", "2", "--strategy", "zero3", "--offload-optimizer", "nvme"});
  ASSERT_FALSE(disk.is_null());
  EXPECT_TRUE(testing::contains(disk.at("flags").get<std::string>(),
                                "--strategy zero3 --offload-optimizer nvme --offload-dir " + nvme))
      << disk;
  EXPECT_GE(disk.at("predicted_offload_s").get<double>(), 0) << disk;
  EXPECT_GT(disk.at("measured_step_s").get<double>(), 0) << disk;
  EXPECT_TRUE(paths::list_directory(nvme).empty());
  auto again = testing::run_command(
      "plan_calibrate_again",
      {DTORCH_CLI, "plan", "calibrate", "--out", out, "--nproc-per-node", "2"}, 60);
  EXPECT_NE(again.exit_code(), 0);
  EXPECT_TRUE(testing::contains(again.err, "exists; give a new path")) << again.err;
  // Nor when a launcher starts the ranks itself, and the file is left as it was.
  const std::string before = testing::read_file(out);
  auto launched = testing::run_command("plan_calibrate_launched",
                                       {DTORCH_CLI, "launch", "--standalone", "--nproc-per-node",
                                        "2", "--", DTORCH_CLI, "plan", "calibrate", "--out", out},
                                       60);
  EXPECT_NE(launched.exit_code(), 0);
  EXPECT_TRUE(testing::contains(launched.err, "exists; give a new path")) << launched.err;
  EXPECT_EQ(testing::read_file(out), before);
  // GPUs asked for where there are none: refused before any rank starts, naming the fix.
  if (cuda_availability().visible == 0) {
    auto cuda = testing::run_command("plan_calibrate_cuda",
                                     {DTORCH_CLI, "plan", "calibrate", "--out", dir + "/gpu.json",
                                      "--nproc-per-node", "2", "--device", "cuda"},
                                     60);
    EXPECT_NE(cuda.exit_code(), 0);
    EXPECT_TRUE(testing::contains(cuda.err, "--device cuda:")) << cuda.err;
    EXPECT_FALSE(paths::exists(dir + "/gpu.json"));
  }
}

// On two nodes (two launchers on 127.0.0.1, each node's ranks over shared memory and the nodes
// over Gloo's TCP), calibrate measures within rank 0's node and across the nodes (one group at a
// time, and every rank of a node at once), and the file
// plans a job across nodes, whose hybrid layout --validate runs as two launchers too.
TEST(PlanCalibrate, MeasuresWithinAndAcrossNodesOnTwoNodes) {
  const std::string dir = testing::scratch_dir("plan_calibrate_nodes");
  const std::string out = dir + "/machine.json";
  const int port = testing::free_port();
  std::vector<testing::Command> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(testing::start_launch(
        testing::scratch_dir("plan_calibrate_node" + std::to_string(node)),
        {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", std::to_string(port), "--", DTORCH_CLI,
         "plan", "calibrate", "--out", out, "--quick"}));
  for (const auto& node : nodes) {
    auto r = testing::finish_command(node, 120);
    ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  }
  const plan::Machine m = plan::read_machine(out);
  EXPECT_EQ(m.ranks_per_node, 2);
  EXPECT_TRUE(testing::contains(m.name, "2 nodes x 2 ranks")) << m.name;
  auto sizes = [](const std::vector<plan::LinkCost>& links) {
    std::vector<int> n;
    for (const plan::LinkCost& l : links) {
      EXPECT_GT(l.bus_bytes_per_s, 0);
      n.push_back(l.ranks);
    }
    return n;
  };
  for (plan::Collective op : {plan::Collective::AllReduce, plan::Collective::ReduceScatter,
                              plan::Collective::AllGather}) {
    EXPECT_EQ(sizes(m.intra_node.at(op)), std::vector<int>({2}));
    EXPECT_EQ(sizes(m.inter_node.at(op)), std::vector<int>({2, 4}));
  }
  EXPECT_EQ(sizes(m.intra_node.at(plan::Collective::P2P)), std::vector<int>({2}));
  EXPECT_EQ(sizes(m.inter_node.at(plan::Collective::P2P)), std::vector<int>({2}));
  // And both ranks of each node across at once, in two groups of one rank a node.
  EXPECT_EQ(sizes(m.inter_node_concurrent.at(plan::Collective::AllReduce)), std::vector<int>({2}));
  auto plan = testing::run_command(
      "plan_across_nodes",
      {DTORCH_CLI, "plan", "--model", "gpt-debug", "--nodes", "2", "--nproc-per-node", "2",
       "--global-batch-size", "4", "--machine", out, "--format", "json"},
      60);
  EXPECT_EQ(plan.exit_code(), 0) << plan.err;
  EXPECT_TRUE(testing::contains(plan.out, "\"predicted_step_s\"")) << plan.out;
  // --validate runs a hybrid layout's 2 nodes as two launchers here (Note [Hybrid sharding]).
  const nlohmann::json first = validated_first(
      "plan_validated_across_nodes", out,
      {"--nodes", "2", "--nproc-per-node", "2", "--strategy", "zero3", "--dp-replicate", "2"});
  ASSERT_FALSE(first.is_null());
  EXPECT_EQ(first.at("dp_replicate"), 2) << first;
  EXPECT_TRUE(testing::contains(first.at("flags").get<std::string>(), "--dp-replicate 2")) << first;
  EXPECT_GT(first.at("measured_step_s").get<double>(), 0) << first;
  EXPECT_GT(first.at("measured_peak_gib").get<double>(), 0) << first;
}

}  // namespace
}  // namespace dtorch
