// The source tree's layers: core <- launch <- comm <- parallel <- checkpoint <- train, with models,
// data, optim and report on core only beside them, and plan (the cost model, and calibration,
// which measures over the job's ranks) on parallel and report: each folder includes only from the
// folders below it.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "dtorch/core/paths.h"

namespace dtorch {
namespace {

// Every file under `root`, as "root/sub/name"; a folder that cannot be listed fails the test.
std::vector<std::string> files_under(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> files = paths::list_files_recursively(root, ec);
  EXPECT_FALSE(ec) << "cannot list " << root << ": " << ec.message();
  return files;
}

TEST(Layering, EachFolderIncludesOnlyFromTheLayersBelowIt) {
  const std::map<std::string, std::set<std::string>> allowed = {
      {"core", {"core"}},
      {"launch", {"core", "launch"}},
      {"comm", {"core", "launch", "comm"}},
      {"models", {"core", "models"}},
      {"data", {"core", "data"}},
      {"optim", {"core", "optim"}},
      {"parallel", {"core", "launch", "comm", "models", "optim", "parallel"}},
      {"checkpoint", {"core", "comm", "models", "optim", "parallel", "checkpoint"}},
      {"report", {"core", "report"}},
      {"plan", {"core", "launch", "comm", "models", "parallel", "report", "plan"}},
      {"train",
       {"core", "launch", "comm", "models", "data", "optim", "parallel", "checkpoint", "report",
        "train"}},
  };
  const std::regex include(R"re(#include "dtorch/([a-z_]+)/)re");
  const std::string root = std::string(DTORCH_SOURCE_DIR) + "/src/dtorch/";
  const std::vector<std::string> sources = files_under(root);
  int files = 0;
  for (const std::string& path : sources) {
    const std::string rel = path.substr(root.size());
    if (rel.find('/') == std::string::npos) continue;  // dtorch.h
    const std::string layer = rel.substr(0, rel.find('/'));
    ASSERT_TRUE(allowed.count(layer)) << "a folder the layering does not know: " << layer;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, include)) {
        EXPECT_TRUE(allowed.at(layer).count(m[1].str()))
            << rel << " (" << layer << ") includes from " << m[1].str();
      }
    }
    ++files;
  }
  EXPECT_GT(files, 50);
}

// parallel/ applies parallelism to any model through the model interface: it includes none of
// the models themselves (a model's tensor-parallel plan lives beside it, models/tensor_plan.h;
// context parallelism replaces the attention core every transformer shares, models/attention.h).
TEST(Layering, ParallelIncludesTheModelInterfaceOnly) {
  const std::set<std::string> interface = {"model.h",      "tensor_plan.h", "module_hooks.h",
                                           "unit_seeds.h", "stage_union.h", "attention.h"};
  const std::regex include(R"re(#include "dtorch/models/([a-z_]+\.h)")re");
  const std::string root = std::string(DTORCH_SOURCE_DIR) + "/src/dtorch/parallel/";
  const std::vector<std::string> sources = files_under(root);
  int includes = 0;
  for (const std::string& path : sources) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      ++includes;
      EXPECT_TRUE(interface.count(m[1].str()))
          << path.substr(root.size()) << " includes the model " << m[1].str();
    }
  }
  EXPECT_GT(includes, 5);
}

// A file tells one story (STYLE.md: sources under ~700 lines); one that outgrows it is split by
// concern, what the parts share in a header of its own (comm/communicator_internal.h).
TEST(Layering, NoSourceFileIsOver700Lines) {
  constexpr int kMaxLines = 700;
  const std::string root = std::string(DTORCH_SOURCE_DIR) + "/src/dtorch/";
  const std::vector<std::string> sources = files_under(root);
  int files = 0;
  for (const std::string& path : sources) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << "cannot read " << path;
    int lines = 0;
    for (std::string line; std::getline(in, line);)
      ++lines;
    EXPECT_LE(lines, kMaxLines) << "src/dtorch/" << path.substr(root.size()) << " has " << lines
                                << " lines; split it by concern, each file telling one story";
    ++files;
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace dtorch
