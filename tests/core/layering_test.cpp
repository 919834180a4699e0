// The source tree's layers form one line, core <- launch <- comm <- parallel <- train (models
// and data beside them, on core only): each folder includes only from the folders below it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

namespace dtorch {
namespace {

TEST(Layering, EachFolderIncludesOnlyFromTheLayersBelowIt) {
  const std::map<std::string, std::set<std::string>> allowed = {
      {"core", {"core"}},
      {"launch", {"core", "launch"}},
      {"comm", {"core", "launch", "comm"}},
      {"models", {"core", "models"}},
      {"data", {"core", "data"}},
      {"parallel", {"core", "launch", "comm", "models", "parallel"}},
      {"train", {"core", "launch", "comm", "models", "data", "parallel", "train"}},
  };
  const std::regex include(R"re(#include "dtorch/([a-z_]+)/)re");
  namespace fs = std::filesystem;
  const fs::path root = fs::path(DTORCH_SOURCE_DIR) / "src" / "dtorch";
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), root);
    if (rel.begin() == rel.end() || std::next(rel.begin()) == rel.end()) continue;  // dtorch.h
    const std::string layer = rel.begin()->string();
    ASSERT_TRUE(allowed.count(layer)) << "a folder the layering does not know: " << layer;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, include)) {
        EXPECT_TRUE(allowed.at(layer).count(m[1].str()))
            << rel.string() << " (" << layer << ") includes from " << m[1].str();
      }
    }
    ++files;
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace dtorch
