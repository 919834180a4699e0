// Slurm's host list and tasks-per-node notations, expanded by hand-written expectations and,
// where Slurm's own scontrol is installed, against `scontrol show hostnames`.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/slurm_lists.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using Hosts = std::vector<std::string>;

TEST(SlurmLists, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_slurm_hostlist("gpu[01-03,07],cpu5"),
            (Hosts{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("n[008-011]"), (Hosts{"n008", "n009", "n010", "n011"}));
  EXPECT_EQ(expand_slurm_hostlist("n[9-10]"), (Hosts{"n9", "n10"}));
  EXPECT_EQ(expand_slurm_hostlist("localhost"), (Hosts{"localhost"}));
  EXPECT_EQ(expand_slurm_hostlist("a[7],b,c[1,3-4]"), (Hosts{"a7", "b", "c1", "c3", "c4"}));
}

TEST(SlurmLists, MultipliesSeveralBracketGroups) {
  EXPECT_EQ(expand_slurm_hostlist("a[1-2]b[3-4]"), (Hosts{"a1b3", "a1b4", "a2b3", "a2b4"}));
  EXPECT_EQ(expand_slurm_hostlist("r[0-1]-n[01-02],login1"),
            (Hosts{"r0-n01", "r0-n02", "r1-n01", "r1-n02", "login1"}));
}

// scontrol itself rejects a suffix after the last group, but site scripts write such lists.
TEST(SlurmLists, KeepsTextAfterAGroup) {
  EXPECT_EQ(expand_slurm_hostlist("n[1-2]-ib"), (Hosts{"n1-ib", "n2-ib"}));
  EXPECT_EQ(expand_slurm_hostlist("x[1-3,5]y,z[09-10]"),
            (Hosts{"x1y", "x2y", "x3y", "x5y", "z09", "z10"}));
}

TEST(SlurmLists, RejectsMalformedListsNamingThem) {
  for (const char* bad : {"n[1-2", "n[a-b]", "n[3-1]", "n[]", "n1,,n2", "n[1-[2]]", "n]1["}) {
    try {
      expand_slurm_hostlist(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(SlurmLists, MatchesScontrolShowHostnames) {
  if (!paths::exists("/usr/bin/scontrol")) {
    GTEST_SKIP() << "scontrol is not installed (Debian package slurm-client)";
  }
  // scontrol expands host lists itself, without a controller, but wants a config to read.
  std::string conf = testing::scratch_dir("scontrol_conf") + "/slurm.conf";
  std::ofstream(conf) << "ClusterName=hostlists\nSlurmctldHost=localhost\n";
  for (const char* list : {"gpu[01-03,07],cpu5", "n[008-011]", "a[1-2]b[3-4]", "n[9-10]",
                           "n[1-3]-ib[0-1]", "a[1-2],b[3-4]c[5]", "c[1,3-4],d"}) {
    auto r =
        testing::run_command("scontrol_hostnames", {"/usr/bin/scontrol", "show", "hostnames", list},
                             20, {"SLURM_CONF=" + conf});
    ASSERT_EQ(r.exit_code(), 0) << list << ": " << r.err;
    Hosts expected;
    std::istringstream in(r.out);
    for (std::string h; std::getline(in, h);)
      if (!h.empty()) expected.push_back(h);
    EXPECT_EQ(expand_slurm_hostlist(list), expected) << list;
  }
}

TEST(SlurmLists, ExpandsTasksPerNode) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,3(x2)"), (std::vector<int>{1, 3, 3}));
  for (const char* bad : {"2(x)", "x", "2(3)", "", "2(x3"}) {
    EXPECT_THROW(expand_slurm_tasks_per_node(bad), ConfigError) << bad;
  }
}

}  // namespace
}  // namespace dtorch::launch
