// Every flag a message of dtorch names exists: each "--flag" inside a string literal of src/
// and tools/ (errors, warnings, hints, help) is an option of some `dtorch` command, or one of
// the few flags of other programs (srun, mpirun) that the launcher's hints name.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"
#include "support/command.h"

namespace dtorch {
namespace {

const std::regex kFlag("--[a-z][a-z0-9_-]*[a-z0-9]");

// Every option of `dtorch` and of each of its subcommands, found through their --help.
void collect_flags(const std::vector<std::string>& command, std::set<std::string>& flags) {
  std::vector<std::string> argv = {DTORCH_CLI};
  argv.insert(argv.end(), command.begin(), command.end());
  argv.push_back("--help");
  auto r = testing::run_command("flags_help", argv, 60);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), kFlag), end; it != end; ++it)
    flags.insert(it->str());
  std::istringstream lines(r.out);
  bool subcommands = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Subcommands:", 0) == 0) {
      subcommands = true;
    } else if (subcommands && line.rfind("  ", 0) == 0 && line.size() > 2 && line[2] != ' ') {
      auto sub = command;
      sub.push_back(line.substr(2, line.find(' ', 2) - 2));
      collect_flags(sub, flags);
    } else if (line.empty() || line[0] != ' ') {
      subcommands = false;
    }
  }
}

TEST(CliFlags, EveryFlagAMessageNamesExists) {
  std::set<std::string> flags;
  collect_flags({}, flags);
  ASSERT_TRUE(flags.count("--nproc-per-node") && flags.count("--pp-split")) << flags.size();
  // Flags of other programs, named where the launcher explains how to start it under them
  // (srun, mpirun, mpiexec) or how Slurm requeues a job (sbatch).
  const std::set<std::string> foreign = {"--ntasks-per-node", "--npernode", "--ppn", "--requeue"};
  const std::regex literal("\"((?:[^\"\\\\\\n]|\\\\.)*)\"");
  std::map<std::string, std::string> unknown;  // flag -> where
  int named = 0;
  for (const char* top : {"src", "tools"}) {
    std::error_code ec;
    const std::string dir = paths::join(DTORCH_SOURCE_DIR, top);
    const std::vector<std::string> files = paths::list_files_recursively(dir, ec);
    ASSERT_FALSE(ec) << "cannot list " << dir << ": " << ec.message();
    for (const std::string& path : files) {
      const std::string ext = paths::extension(path);
      if (ext != ".cpp" && ext != ".h") continue;
      std::ifstream in(path);
      int number = 0;
      for (std::string line; std::getline(in, line);) {
        ++number;
        for (std::sregex_iterator s(line.begin(), line.end(), literal), end; s != end; ++s) {
          const std::string text = (*s)[1];
          for (std::sregex_iterator f(text.begin(), text.end(), kFlag); f != end; ++f) {
            ++named;
            if (!flags.count(f->str()) && !foreign.count(f->str()))
              unknown.emplace(f->str(), paths::file_name(path) + ":" + std::to_string(number));
          }
        }
      }
    }
  }
  EXPECT_GT(named, 100);
  for (const auto& [flag, where] : unknown)
    ADD_FAILURE() << where << " names " << flag << ", which no dtorch command has";
}

}  // namespace
}  // namespace dtorch
