// The source tree's layers: core <- launch <- comm <- parallel <- checkpoint <- train, with models,
// data, optim and report on core only beside them, and plan (the cost model, and calibration,
// which measures over the job's ranks) on parallel and report: each folder includes only from the
// folders below it; train/'s rooms (config/, strategy/) include nothing above them, and each
// folder's namespace is its name.
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
      {"plan", {"core", "launch", "comm", "models", "optim", "parallel", "report", "plan"}},
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

// The dtorch headers `path` includes ("dtorch/comm/communicator.h"), in the order written.
std::vector<std::string> dtorch_includes(const std::string& path) {
  static const std::regex include(R"re(#include "(dtorch/[a-z_/]+\.h)")re");
  std::vector<std::string> found;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, include)) found.push_back(m[1].str());
  }
  return found;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Note [train's rooms] (train/config/run_config.h): the settings reach nothing of the
// communicator, the mesh, a strategy or the loop, through any header; the strategies include
// nothing of the loop.
TEST(Layering, TrainsRoomsIncludeNothingAboveThem) {
  const std::string src = std::string(DTORCH_SOURCE_DIR) + "/src/";
  // The parallel/ and checkpoint/ headers a setting may name: each holds a type and its names,
  // or (replicas.h) a pure rule that resolves a setting.
  const std::set<std::string> light = {
      "dtorch/parallel/cp/kind.h",       "dtorch/parallel/ddp/options.h",
      "dtorch/parallel/pp/schedule.h",   "dtorch/parallel/zero/stage_names.h",
      "dtorch/checkpoint/save_format.h", "dtorch/parallel/replicas.h"};
  // Why config/ may not include `header`; empty when it may.
  auto barred_from_config = [&](const std::string& header) -> std::string {
    if (starts_with(header, "dtorch/comm/")) return "the communicator";
    if (starts_with(header, "dtorch/train/") && !starts_with(header, "dtorch/train/config/"))
      return "a room above config/";
    if ((starts_with(header, "dtorch/parallel/") || starts_with(header, "dtorch/checkpoint/")) &&
        !light.count(header))
      return "more of parallel/ or checkpoint/ than a setting's type (give the type a header of "
             "its own, as parallel/ddp/options.h)";
    return "";
  };
  const auto config = files_below("src/dtorch/train/config/");
  for (const auto& [path, lines] : config) {
    const std::string rel = path.substr(std::string("src/").size());
    std::map<std::string, std::string> reached;  // header -> the file that includes it
    std::vector<std::string> todo = {rel};
    while (!todo.empty()) {
      const std::string file = todo.back();
      todo.pop_back();
      for (const std::string& header : dtorch_includes(src + file)) {
        if (!reached.emplace(header, file).second) continue;
        const std::string why = barred_from_config(header);
        EXPECT_EQ(why, "") << rel << " reaches " << header << " (included by " << file
                           << "): " << why;
        todo.push_back(header);
      }
    }
  }
  EXPECT_GT(config.size(), 10u);
  const auto strategy = files_below("src/dtorch/train/strategy/");
  for (const auto& [path, lines] : strategy) {
    for (const std::string& header : dtorch_includes(std::string(DTORCH_SOURCE_DIR) + "/" + path)) {
      EXPECT_TRUE(!starts_with(header, "dtorch/train/") ||
                  starts_with(header, "dtorch/train/config/") ||
                  starts_with(header, "dtorch/train/strategy/"))
          << path << " includes " << header
          << " of the loop; a strategy includes only config/ and strategy/ of train/";
    }
  }
  EXPECT_GT(strategy.size(), 5u);
}

// A folder's namespace is its name (docs/architecture.md): a file of src/dtorch/<top>/ declares
// dtorch::<top> (core/: dtorch itself), a file of <top>/<sub>/ dtorch::<sub>, or inline
// namespace <sub> where <sub> is a room of <top> (Note [train's rooms]). Declaring another
// namespace besides (a forward declaration) is fine.
TEST(Layering, EachFoldersNamespaceIsItsName) {
  const std::string root = "src/dtorch/";
  int files = 0;
  for (const auto& [path, lines] : files_below(root)) {
    const std::string rel = path.substr(root.size());
    std::vector<std::string> folders;
    for (size_t at = rel.find('/'), from = 0; at != std::string::npos;
         from = at + 1, at = rel.find('/', from))
      folders.push_back(rel.substr(from, at - from));
    if (folders.empty() || folders.front() == "core") continue;
    std::string text;
    for (const std::string& line : lines)
      text += line + "\n";
    const std::string& name = folders.back();
    // A declaration that opens the namespace (not a closing brace's comment naming it).
    const std::string opens = "namespace dtorch::" + name + " \\{";
    const std::regex own(folders.size() == 1 ? opens
                                             : opens + "|inline namespace " + name + " \\{");
    EXPECT_TRUE(std::regex_search(text, own))
        << "src/dtorch/" << rel << " declares no namespace named " << name << ": put it in "
        << (folders.size() == 1 ? "dtorch::" + name
                                : "dtorch::" + name + " (or inline namespace " + name + ")");
    ++files;
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace dtorch
