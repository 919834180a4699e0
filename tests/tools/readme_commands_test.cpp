// README's commands still work as written: each command of its shell blocks that takes seconds
// on a CPU runs here, in README's order, in one working folder; each other one is checked (its
// dtorch flags parse, the make targets it names exist). A command this test cannot place fails
// it, so a command added to README is tested too.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dtorch/core/paths.h"
#include "dtorch/plan/machine.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

// A word as the shell passes it on: quotes removed; `variable` when it is exactly "$NAME" or
// "${NAME}" (quoted or not), `text` then being NAME.
struct Word {
  std::string text;
  bool variable = false;
};

// One simple command of README (a line of a shell block, `\` continuations joined, split at
// && || ; |), or an inline `make ...` of its prose.
struct ReadmeCommand {
  int line = 0;
  std::string text;              // its words joined by spaces ("$NAME" for a variable)
  std::vector<std::string> env;  // NAME=value before the program
  std::vector<Word> words;       // the program and its arguments
};

// The index of what closes the quote or $( at `open` in `s` (npos when nothing does).
size_t closing(const std::string& s, size_t open) {
  if (s[open] == '\'') return s.find('\'', open + 1);
  const bool substitution = s[open] == '$';
  int depth = 0;  // of the parentheses inside $(...)
  for (size_t i = open + (substitution ? 2 : 1); i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      ++i;
    } else if (substitution ? c == ')' && depth-- == 0 : c == '"') {
      return i;
    } else if ((substitution && (c == '\'' || c == '"')) ||
               (c == '$' && i + 1 < s.size() && s[i + 1] == '(')) {
      i = closing(s, i);
      if (i == std::string::npos) return i;
    } else if (substitution && c == '(') {
      ++depth;
    }
  }
  return std::string::npos;
}

// One shell line as simple commands of words: quotes removed, a comment dropped, $(...) kept
// as written.
std::vector<std::vector<Word>> shell_words(const std::string& line) {
  static const std::regex kVariable(R"re("?\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"?)re");
  std::vector<std::vector<Word>> commands(1);
  std::string raw, text;
  bool in_word = false;
  auto finish = [&] {
    if (!in_word) return;
    std::smatch m;
    if (std::regex_match(raw, m, kVariable))
      commands.back().push_back({m[1], true});
    else
      commands.back().push_back({text, false});
    raw.clear();
    text.clear();
    in_word = false;
  };
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t') {
      finish();
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == '&' || c == '|' || c == ';') {
      finish();
      if (i + 1 < line.size() && line[i + 1] == c) ++i;
      commands.emplace_back();
    } else if (c == '\\' && i + 1 < line.size()) {
      in_word = true;
      raw += line.substr(i, 2);
      text += line[++i];
    } else if (c == '\'' || c == '"' || (c == '$' && i + 1 < line.size() && line[i + 1] == '(')) {
      in_word = true;
      const size_t end = std::min(closing(line, i), line.size() - 1);
      raw += line.substr(i, end - i + 1);
      text += c == '$' ? line.substr(i, end - i + 1) : line.substr(i + 1, end - i - 1);
      i = end;
    } else {
      in_word = true;
      raw += c;
      text += c;
    }
  }
  finish();
  commands.erase(std::remove_if(commands.begin(), commands.end(),
                                [](const std::vector<Word>& w) { return w.empty(); }),
                 commands.end());
  return commands;
}

void add_commands(int line, const std::string& shell, std::vector<ReadmeCommand>& out) {
  static const std::regex kAssignment("[A-Za-z_][A-Za-z0-9_]*=.*");
  for (auto& words : shell_words(shell)) {
    ReadmeCommand c;
    c.line = line;
    for (const Word& w : words) {
      c.text += (c.text.empty() ? "" : " ") + (w.variable ? "$" + w.text : w.text);
      if (c.words.empty() && !w.variable && std::regex_match(w.text, kAssignment))
        c.env.push_back(w.text);
      else
        c.words.push_back(w);
    }
    if (!c.words.empty()) out.push_back(c);
  }
}

// Every command of README's sh/bash/shell/console blocks (in a console block, the lines after a
// "$ " prompt), and the inline `make ...` of its prose.
std::vector<ReadmeCommand> readme_commands(const std::string& path) {
  static const std::regex kInlineMake("`(make [^`]+)`");
  std::vector<ReadmeCommand> out;
  std::ifstream in(path);
  std::string lang, pending;
  bool in_block = false;
  int number = 0, start = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string trimmed = line.substr(std::min(line.find_first_not_of(" \t"), line.size()));
    if (trimmed.rfind("```", 0) == 0) {
      in_block = !in_block;
      lang = in_block ? trimmed.substr(3) : "";
      continue;
    }
    if (!in_block) {
      for (std::sregex_iterator m(line.begin(), line.end(), kInlineMake), end; m != end; ++m)
        add_commands(number, (*m)[1], out);
      continue;
    }
    if (lang != "sh" && lang != "bash" && lang != "shell" && lang != "console") continue;
    std::string text = trimmed;
    if (pending.empty()) {
      start = number;
      if (text.rfind("$ ", 0) == 0)
        text = text.substr(2);
      else if (lang == "console")
        continue;  // the output of the command above
    }
    if (!text.empty() && text.back() == '\\') {
      pending += text.substr(0, text.size() - 1) + " ";
      continue;
    }
    add_commands(start, pending + text, out);
    pending.clear();
  }
  return out;
}

bool is_dtorch(const Word& w) {
  if (w.variable) return w.text == "DTORCH";
  return w.text == "dtorch" || (w.text.size() > 7 && w.text.rfind("/dtorch") == w.text.size() - 7);
}

// A machine file for nodes of 8 GPUs, measured within and across nodes (README's `dtorch plan`
// reads one, written for a cluster it does not run on).
void write_cluster_file(const std::string& path) {
  plan::Machine m;
  m.name = "8 x H100 nodes";
  m.device = "cuda";
  m.ranks_per_node = 8;
  m.memory_per_rank_bytes = 85e9;
  m.base_bytes_per_rank = 1.5e9;
  m.matmul_flops = {{"fp32", 5e13}, {"bf16", 6e14}};
  m.adamw_seconds_per_parameter = 2e-11;
  for (plan::Collective c : {plan::Collective::AllReduce, plan::Collective::ReduceScatter,
                             plan::Collective::AllGather, plan::Collective::P2P}) {
    const bool p2p = c == plan::Collective::P2P;
    m.intra_node[c] = {{p2p ? 2 : 8, 1e-5, 3.6e11}};
    m.inter_node[c] = {{p2p ? 2 : 64, 2e-5, 4.5e10}};
  }
  std::ofstream(path) << plan::machine_json(m);
}

// README's dtorch commands that do not run exactly as written, each with why. The others run as
// written; those that elide flags ("...") or run under srun or mpirun are checked.
enum class How {
  Shorter,   // run with `more` added
  Prepared,  // run as written once `prepare` has made what it reads
  Checked,   // too long, or needs a GPU, nodes or a cluster
};
struct Listed {
  std::string command;
  How how;
  std::string why;
  std::vector<std::string> more = {};
  std::function<void(const std::string& work)> prepare = nullptr;
};

const std::vector<Listed>& listed() {
  static const std::vector<Listed> kListed = {
      {"build/dtorch train --model mnist-cnn --data fashion-mnist --epochs 2 --batch-size 64 "
       "--lr 0.01 --optimizer sgd --seed 1 --out runs/cnn --nproc-per-node 2",
       How::Shorter,
       "all of Fashion-MNIST takes a minute on 2 cores "
       "(TrainCli.OneEpochOfMnistCnnReaches85Percent trains on all of it)",
       {"--train-samples", "512", "--test-samples", "256"}},
      {"build/dtorch train --model gpt-small --data text --strategy zero3 --optimizer adamw "
       "--precision bf16 --lr-schedule warmup-cosine --nproc-per-node 4 --out runs/gpt",
       How::Checked, "GPT-2's 124M parameters train for hours on a CPU"},
      {"build/dtorch train --config runs/gpt/config.json --resume", How::Checked,
       "continues the gpt-small run above"},
      {"build/dtorch plot runs/cnn runs/gpt --out curves.png",
       How::Prepared,
       "the gpt-small run is checked only, so runs/gpt gets runs/cnn's metrics",
       {},
       [](const std::string& work) {
         paths::copy_file(work + "/runs/cnn/metrics.jsonl", work + "/runs/gpt/metrics.jsonl");
       }},
      {"build/dtorch plan --model gpt-large --nodes 8 --gpus-per-node 8 --global-batch-size 512 "
       "--seq-len 1024 --machine cluster.json",
       How::Prepared,
       "cluster.json is a machine file of 8-GPU nodes",
       {},
       [](const std::string& work) { write_cluster_file(work + "/cluster.json"); }},
      {"~/.local/bin/dtorch launch --nproc-per-node 2 -- /tmp/example/ddp_custom_model",
       How::Checked,
       "installing dtorch and building the example takes minutes "
       "(Install.ExampleBuildsAgainstInstalledPackage does, and runs it)"},
      {"build/dtorch launch --nproc-per-node 4 -- ./my_program --its-flags",
       How::Prepared,
       "./my_program is a script that exits 0",
       {},
       [](const std::string& work) {
         std::ofstream(work + "/my_program") << "#!/bin/sh\nexit 0\n";
         ::chmod((work + "/my_program").c_str(), 0755);
       }},
      {"build/dtorch launch --nnodes 2:4 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint "
       "node0:29400 --rdzv-id job1 --max-restarts 3 -- ./my_program",
       How::Checked,
       "needs 2 to 4 nodes, one named node0 (ElasticLaunch.* runs launchers on one machine)"},
      {"build-gpu/dtorch train --device cuda --model gpt-small --data text --seq-len 1024 "
       "--batch-size 16 --precision bf16 --optimizer adamw --lr 6e-4 --nproc-per-node 8 "
       "--out runs/gpt",
       How::Checked, "needs 8 GPUs (CudaTrain.* trains on one)"},
  };
  return kListed;
}

// Programs that start README's dtorch on a cluster; what they start is checked.
const std::set<std::string> kWrappers = {
    "srun",    // needs Slurm (SlurmJobs.* run dtorch under a private slurmctld)
    "mpirun",  // needs MPI (Mpirun.* run dtorch under Open MPI)
};

struct Help {
  std::set<std::string> flags, subcommands;
};

class ReadmeCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = testing::scratch_dir("readme_commands");
    logs_ = testing::scratch_dir("readme_commands_logs");
    std::ifstream in(paths::join(DTORCH_SOURCE_DIR, "Makefile"));
    static const std::regex kRule(R"(^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?!=).*)");
    static const std::regex kAssignment(R"(^([A-Za-z_][A-Za-z0-9_]*)[ \t]*[?:+]?=.*)");
    static const std::regex kName("[A-Za-z0-9_.-]+");
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
      if (std::regex_match(line, m, kAssignment)) {
        make_variables_.insert(m[1]);
      } else if (std::regex_match(line, m, kRule)) {
        const std::string names = m[1];
        for (std::sregex_iterator t(names.begin(), names.end(), kName), end; t != end; ++t)
          make_targets_.insert(t->str());
      }
    }
    ASSERT_TRUE(make_targets_.count("demo") && make_variables_.count("TORCH"));
  }

  // What `dtorch PATH... --help` lists: its flags and subcommands.
  const Help& help(const std::vector<std::string>& path) {
    auto [it, fresh] = helps_.try_emplace(path);
    if (!fresh) return it->second;
    static const std::regex kFlag("--[a-z][a-z0-9_-]*[a-z0-9]");
    std::vector<std::string> argv = {DTORCH_CLI};
    argv.insert(argv.end(), path.begin(), path.end());
    argv.push_back("--help");
    auto r = testing::run_command("readme_help", argv, 60);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    for (std::sregex_iterator f(r.out.begin(), r.out.end(), kFlag), end; f != end; ++f)
      it->second.flags.insert(f->str());
    std::istringstream lines(r.out);
    bool listing = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("Subcommands:", 0) == 0)
        listing = true;
      else if (listing && line.rfind("  ", 0) == 0 && line.size() > 2 && line[2] != ' ')
        it->second.subcommands.insert(line.substr(2, line.find(' ', 2) - 2));
      else if (line.empty() || line[0] != ' ')
        listing = false;
    }
    return it->second;
  }

  // A word as the shell would expand it here: dtorch is the CLI under test, another variable
  // a file of the working folder named after it.
  static std::string expand(const Word& w) {
    if (is_dtorch(w)) return DTORCH_CLI;
    if (!w.variable) return w.text;
    std::string name = w.text;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return name;
  }

  testing::CommandResult run(const ReadmeCommand& c, const std::vector<std::string>& argv) {
    return testing::finish_command(testing::start_command(logs_, argv, c.env, work_), 60);
  }

  // Runs `dtorch ARGS MORE` as README's command `c` would run.
  void run_dtorch(const ReadmeCommand& c, std::vector<std::string> args,
                  const std::vector<std::string>& more) {
    // A user's first launch takes torchrun's port 29500; a test beside it may hold it.
    auto has = [&](const char* flag) {
      return std::find(args.begin(), args.end(), flag) != args.end();
    };
    if (!args.empty() && args[0] == "launch" && !has("--master-port") && !has("--standalone") &&
        !has("--rdzv-endpoint") && testing::listening(29500))
      args.insert(args.begin() + 1, {"--master-port", std::to_string(testing::free_port())});
    args.insert(args.begin(), DTORCH_CLI);
    args.insert(args.end(), more.begin(), more.end());
    auto r = run(c, args);
    EXPECT_EQ(r.exit_code(), 0) << "README.md:" << c.line << ": `" << c.text << "` failed here:\n"
                                << r.err;
  }

  // Checks `dtorch ARGS` without running it: train resolves its configuration (and leaves in
  // --out the config.json its run would write, for the commands after it); every other
  // command's flags are ones it has.
  void check_dtorch(const ReadmeCommand& c, const std::vector<std::string>& args) {
    if (args.empty()) return;
    if (args[0] == "train") {
      std::vector<std::string> argv = {DTORCH_CLI};
      argv.insert(argv.end(), args.begin(), args.end());
      argv.push_back("--print-config");
      auto r = run(c, argv);
      EXPECT_EQ(r.exit_code(), 0) << "README.md:" << c.line << ": `" << c.text
                                  << "`: its dtorch train flags are refused:\n"
                                  << r.err;
      auto out = std::find(args.begin(), args.end(), "--out");
      if (r.exit_code() == 0 && out != args.end() && out + 1 != args.end() &&
          (out + 1)->front() != '/') {
        const std::string folder = paths::join(work_, *(out + 1));
        paths::create_directories(folder);
        if (!paths::exists(folder + "/config.json"))
          std::ofstream(folder + "/config.json") << r.out;
      }
      return;
    }
    std::vector<std::string> path = {args[0]};
    size_t i = 1;
    while (i < args.size() && help(path).subcommands.count(args[i]))
      path.push_back(args[i++]);
    const Help& h = help(path);
    for (; i < args.size() && args[i] != "--"; ++i) {
      const std::string flag = args[i].substr(0, args[i].find('='));
      if (flag.rfind("--", 0) != 0) continue;
      EXPECT_TRUE(h.flags.count(flag)) << "README.md:" << c.line << ": `" << c.text << "` gives "
                                       << flag << ", which dtorch " << args[0] << " does not have";
    }
    // What `dtorch launch` starts: checked too when it is dtorch.
    if (args[0] == "launch" && i + 1 < args.size() && is_dtorch({args[i + 1], false}))
      check_dtorch(c, std::vector<std::string>(args.begin() + i + 2, args.end()));
  }

  void dtorch_command(const ReadmeCommand& c, size_t program) {
    std::vector<std::string> args;
    bool elided = false;
    for (size_t i = program + 1; i < c.words.size(); ++i) {
      if (c.words[i].text == "..." && !c.words[i].variable)
        elided = true;
      else
        args.push_back(expand(c.words[i]));
    }
    auto it = std::find_if(listed().begin(), listed().end(),
                           [&](const Listed& l) { return l.command == c.text; });
    std::optional<::testing::ScopedTrace> why;
    if (it != listed().end()) {
      used_.insert(it->command);
      why.emplace(__FILE__, __LINE__, "listed: " + it->why);
    }
    if (elided || program > 0 || (it != listed().end() && it->how == How::Checked)) {
      ++checked_;
      return check_dtorch(c, args);
    }
    ++ran_;
    if (it == listed().end()) return run_dtorch(c, args, {});
    try {
      if (it->prepare) it->prepare(work_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "README.md:" << c.line << ": `" << c.text
                    << "`: cannot make what it reads: " << e.what();
      return;
    }
    run_dtorch(c, args, it->more);
  }

  void make_command(const ReadmeCommand& c) {
    ++checked_;
    for (size_t i = 1; i < c.words.size(); ++i) {
      const std::string& a = c.words[i].text;
      if (a.rfind("-", 0) == 0) continue;
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        EXPECT_TRUE(make_variables_.count(a.substr(0, eq)))
            << "README.md:" << c.line << ": `" << c.text << "` sets " << a.substr(0, eq)
            << ", which Makefile does not read";
      } else {
        EXPECT_TRUE(make_targets_.count(a))
            << "README.md:" << c.line << ": `" << c.text << "` names target " << a
            << ", which Makefile does not have";
      }
    }
  }

  void cmake_command(const ReadmeCommand& c) {
    ++checked_;
    for (size_t i = 1; i + 1 < c.words.size(); ++i) {
      if (c.words[i].text != "-S") continue;
      const std::string dir = paths::join(DTORCH_SOURCE_DIR, c.words[i + 1].text);
      EXPECT_TRUE(paths::exists(dir + "/CMakeLists.txt"))
          << "README.md:" << c.line << ": `" << c.text << "` configures " << c.words[i + 1].text
          << ", which has no CMakeLists.txt";
    }
  }

  // Runs or checks README's command `c`; fails on a command it cannot place.
  void test(const ReadmeCommand& c) {
    const Word& program = c.words[0];
    if (is_dtorch(program)) return dtorch_command(c, 0);
    // make installs packages and builds, cmake builds (minutes): the suite itself is their run,
    // with Install.ExampleBuildsAgainstInstalledPackage for `cmake --install` and the example.
    if (program.text == "make") return make_command(c);
    if (program.text == "cmake") return cmake_command(c);
    if (kWrappers.count(program.text)) {
      auto dtorch = std::find_if(c.words.begin(), c.words.end(), is_dtorch);
      if (dtorch != c.words.end()) return dtorch_command(c, dtorch - c.words.begin());
    }
    ADD_FAILURE() << "README.md:" << c.line << ": `" << c.text << "` runs " << program.text
                  << ", which this test neither runs nor checks: make it run here in seconds, "
                     "or teach "
                  << __FILE__ << " how to check it and why it cannot run";
  }

  std::string work_, logs_;
  std::set<std::string> make_targets_, make_variables_;
  std::map<std::vector<std::string>, Help> helps_;
  std::set<std::string> used_;
  int ran_ = 0, checked_ = 0;
};

TEST_F(ReadmeCommands, RunAsWrittenOrCheckTheirFlags) {
  const std::vector<ReadmeCommand> commands =
      readme_commands(paths::join(DTORCH_SOURCE_DIR, "README.md"));
  for (const ReadmeCommand& c : commands)
    test(c);
  for (const Listed& l : listed())
    EXPECT_TRUE(used_.count(l.command))
        << "README no longer has `" << l.command << "`: remove it from the list";
  EXPECT_GE(ran_, 4) << commands.size() << " commands";
  EXPECT_GE(checked_, 8) << commands.size() << " commands";
}

}  // namespace
}  // namespace dtorch
