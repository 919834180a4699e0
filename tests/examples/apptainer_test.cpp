// What can be checked of the Apptainer image without Apptainer (not packaged in Debian 12): the
// %post script parses, installs exactly scripts/install-deps' build and data groups, unpacks the
// archive %files copies in; the Slurm script parses and reads the node rank on each node.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;
using testing::read_file;

const std::string kDef = std::string(DTORCH_SOURCE_DIR) + "/examples/apptainer/dtorch.def";
const std::string kSbatch = std::string(DTORCH_SOURCE_DIR) + "/examples/apptainer/train.sbatch";

// The body of one %section of a definition file: the lines up to the next %section.
std::string section(const std::string& def, const std::string& name) {
  std::istringstream in(def);
  std::string line, body;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '%') {
      inside = line.substr(0, line.find_first_of(" \t")) == "%" + name;
      continue;
    }
    if (inside) body += line + "\n";
  }
  return body;
}

int bash_n(const std::string& script, const std::string& name) {
  std::string path = testing::scratch_dir(name) + "/script.sh";
  std::ofstream(path) << script;
  int rc = std::system(("bash -n " + path + " 2>/dev/null").c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

std::set<std::string> words(const std::string& s) {
  std::istringstream in(s);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

// `NAME="a b c"` in `text`, as a set of words; empty when absent.
std::set<std::string> quoted_list(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(name + R"(=\"([^\"]*)\")"))) return {};
  return words(m[1]);
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& w : s)
    out += (out.empty() ? "" : " ") + w;
  return out;
}

TEST(Apptainer, PostSectionIsValidBash) {
  std::string post = section(read_file(kDef), "post");
  ASSERT_TRUE(contains(post, "cmake --build")) << post;
  EXPECT_EQ(bash_n(post, "apptainer-post"), 0) << post;
  // The check itself can fail: a broken script does not pass.
  EXPECT_NE(bash_n(post + "\nif then\n", "apptainer-post-broken"), 0);
}

TEST(Apptainer, InstallsExactlyTheBuildAndDataGroupsOfInstallDeps) {
  std::string post = section(read_file(kDef), "post");
  std::string deps = read_file(std::string(DTORCH_SOURCE_DIR) + "/scripts/install-deps");
  for (auto [var, group] : {std::pair<std::string, std::string>{"DTORCH_BUILD_PACKAGES", "build"},
                            {"DTORCH_DATA_PACKAGES", "data"}}) {
    auto in_def = quoted_list(post, var);
    auto in_deps = quoted_list(deps, "\\[" + group + "\\]");
    ASSERT_FALSE(in_deps.empty()) << "no [" << group << "] group in scripts/install-deps";
    EXPECT_EQ(in_def, in_deps) << var << " in examples/apptainer/dtorch.def is '" << joined(in_def)
                               << "' but the " << group << " group of scripts/install-deps is '"
                               << joined(in_deps) << "': make them equal";
    EXPECT_TRUE(contains(post, "$" + var)) << var << " is defined but not installed";
  }
}

TEST(Apptainer, UnpacksTheArchiveItCopiesIn) {
  std::string def = read_file(kDef);
  EXPECT_TRUE(contains(def, "Bootstrap: docker\nFrom: debian:12\n")) << def;
  std::smatch m;
  std::string files = section(def, "files");
  ASSERT_TRUE(std::regex_search(files, m, std::regex(R"(\s*(\S+)\s+(\S+))"))) << files;
  EXPECT_EQ(m[1].str(), "dtorch-src.tar.gz");
  EXPECT_TRUE(contains(section(def, "post"), "tar -xzf " + m[2].str())) << m[2];
  EXPECT_TRUE(contains(section(def, "runscript"), "exec dtorch \"$@\""));
}

TEST(Apptainer, SlurmScriptParsesAndReadsTheNodeRankOnEachNode) {
  std::string s = read_file(kSbatch);
  EXPECT_EQ(bash_n(s, "apptainer-sbatch"), 0);
  // $SLURM_NODEID inside single quotes: expanded by each task, not once by the batch script.
  auto quote = s.find("bash -c '");
  auto nodeid = s.find("--node-rank \"$SLURM_NODEID\"");
  ASSERT_NE(quote, std::string::npos) << s;
  ASSERT_NE(nodeid, std::string::npos) << s;
  EXPECT_LT(quote, nodeid);
  EXPECT_GT(s.find('\'', quote + 9), nodeid) << "the quoted command ends before the node rank";
  EXPECT_TRUE(contains(s, "apptainer exec --nv")) << s;
}

}  // namespace
}  // namespace dtorch
