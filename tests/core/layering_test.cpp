// The source tree's layers: core <- launch <- comm <- parallel <- checkpoint <- train, with models,
// data, optim and report on core only beside them, and plan (the cost model, and calibration,
// which measures over the job's ranks) on parallel and report: each folder includes only from the
// folders below it.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtorch/core/paths.h"

namespace dtorch {
namespace {

// The files of `dir` (below the source tree), each with its path and its lines.
std::vector<std::pair<std::string, std::vector<std::string>>> files_below(const std::string& dir) {
  const std::string root = std::string(DTORCH_SOURCE_DIR) + "/" + dir;
  std::error_code ec;
  const std::vector<std::string> paths = paths::list_files_recursively(root, ec);
  EXPECT_FALSE(ec) << "cannot list " << root << ": " << ec.message();
  std::vector<std::pair<std::string, std::vector<std::string>>> files;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    files.emplace_back(dir + path.substr(root.size()), std::vector<std::string>{});
    for (std::string line; std::getline(in, line);)
      files.back().second.push_back(line);
  }
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
  const std::string root = "src/dtorch/";
  int files = 0;
  for (const auto& [path, lines] : files_below(root)) {
    const std::string rel = path.substr(root.size());
    if (rel.find('/') == std::string::npos) continue;  // dtorch.h
    const std::string layer = rel.substr(0, rel.find('/'));
    ASSERT_TRUE(allowed.count(layer)) << "a folder the layering does not know: " << layer;
    for (const std::string& line : lines) {
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
// So do plan/ and tools/, which also name models through the registry (each a Model): the
// planner and the benchmarks read a model's shape from its own account of it (Model::workload,
// models/workload.h).
TEST(Layering, ParallelPlanAndToolsIncludeTheModelInterfaceOnly) {
  const std::set<std::string> interface = {"model.h",        "workload.h",   "tensor_plan.h",
                                           "module_hooks.h", "unit_seeds.h", "stage_union.h",
                                           "attention.h"};
  const std::map<std::string, std::set<std::string>> beyond = {{"src/dtorch/parallel/", {}},
                                                               {"src/dtorch/plan/", {"registry.h"}},
                                                               {"tools/", {"registry.h"}}};
  const std::regex include(R"re(#include "dtorch/models/([a-z_]+\.h)")re");
  for (const auto& [dir, registry] : beyond) {
    int includes = 0;
    for (const auto& [path, lines] : files_below(dir))
      for (const std::string& line : lines) {
        std::smatch m;
        if (!std::regex_search(line, m, include)) continue;
        ++includes;
        EXPECT_TRUE(interface.count(m[1].str()) || registry.count(m[1].str()))
            << path << " includes the model " << m[1].str();
      }
    EXPECT_GT(includes, 1) << dir;
  }
}

// Nor do plan/ and tools/ cast to a model: every class of models/ that derives from Model.
TEST(Layering, PlanAndToolsCastToNoModel) {
  const std::regex model_class(R"re(class (\w+) : public Model\b)re");
  std::set<std::string> models;
  for (const auto& [path, lines] : files_below("src/dtorch/models/"))
    for (const std::string& line : lines) {
      std::smatch m;
      if (std::regex_search(line, m, model_class)) models.insert(m[1].str());
    }
  EXPECT_TRUE(models.count("GPT") && models.count("VisionTransformer") && models.count("ResNet"))
      << models.size() << " model classes";
  const std::regex cast(R"re(dynamic_cast<\s*(?:const\s+)?(?:\w+::)*(\w+))re");
  int files = 0;
  for (const char* dir : {"src/dtorch/plan/", "tools/"})
    for (const auto& [path, lines] : files_below(dir)) {
      ++files;
      for (const std::string& line : lines)
        for (std::sregex_iterator c(line.begin(), line.end(), cast), end; c != end; ++c)
          EXPECT_FALSE(models.count((*c)[1].str())) << path << " casts to " << (*c)[1].str();
    }
  EXPECT_GT(files, 10);
}

// A file tells one story (STYLE.md: sources under ~700 lines); one that outgrows it is split by
// concern, what the parts share in a header of its own (comm/communicator_internal.h).
TEST(Layering, NoSourceFileIsOver700Lines) {
  constexpr size_t kMaxLines = 700;
  int files = 0;
  for (const auto& [path, lines] : files_below("src/dtorch/")) {
    EXPECT_LE(lines.size(), kMaxLines)
        << path << " has " << lines.size()
        << " lines; split it by concern, each file telling one story";
    ++files;
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace dtorch
