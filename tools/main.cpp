// Entry point of the `dtorch` command line: parses the subcommand and turns every error into
// one clear message and a non-zero exit code. Library code never exits; only this does.
#include <torch/cuda.h>
#include <torch/version.h>

#include <iostream>
#include <typeinfo>

#include "dtorch/comm/communicator.h"
#include "dtorch/core/error.h"
#include "dtorch/launch/process.h"
#include "tools/commands.h"

namespace dtorch::tools {
namespace {
std::vector<std::string> g_command_line;
}
const std::vector<std::string>& command_line() {
  return g_command_line;
}
void set_command_line(int argc, char** argv) {
  g_command_line.assign(argv, argv + argc);
}

std::set<std::string> flags_given(const CLI::App& cmd) {
  std::set<std::string> given;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0) continue;
    for (const auto& name : opt->get_lnames())
      given.insert("--" + name);
  }
  // Option groups are nameless sub-apps.
  for (const CLI::App* sub :
       cmd.get_subcommands([](const CLI::App* a) { return a->get_name().empty(); })) {
    auto more = flags_given(*sub);
    given.insert(more.begin(), more.end());
  }
  return given;
}

namespace {
// A user's error (bad flags, data, checkpoints, a lost peer) names the flag or file to fix;
// the source location DTORCH_CHECK appends only helps with dtorch's own bugs, so it is kept
// for plain dtorch::Error alone.
std::string user_message(const Error& e) {
  if (typeid(e) == typeid(Error)) return e.what();
  return without_locations(e.what());
}

// `dtorch version`: what this build was made against, for bug reports and job logs.
void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "The LibTorch and backends this dtorch was built with");
  cmd->callback([] {
    std::string backends;
    for (const auto& b : comm::compiled_backends())
      backends += (backends.empty() ? "" : ", ") + b;
    std::cout << "dtorch " << DTORCH_VERSION << "\nLibTorch " << TORCH_VERSION << "\nbackends "
              << backends << "\nCUDA devices " << static_cast<int>(torch::cuda::device_count())
              << std::endl;
  });
}
}  // namespace

int run_command_line(int argc, char** argv) {
  set_command_line(argc, argv);
  CLI::App app{"dtorch: distributed training for C++ on LibTorch"};
  app.require_subcommand(1);
  int exit_code = 0;
  add_launch_command(app, exit_code);
  add_train_command(app, exit_code);
  add_bench_command(app, exit_code);
  add_checkpoint_command(app, exit_code);
  add_pipeline_command(app, exit_code);
  add_plan_command(app, exit_code);
  add_plot_command(app, exit_code);
  add_version_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::cerr << "dtorch: error: " << user_message(e) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dtorch: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}

}  // namespace dtorch::tools

int main(int argc, char** argv) {
  // Note [Fork server]: the test suite's; before anything else runs.
  try {
    dtorch::launch::serve_forks_when_asked(
        "DTORCH_FORK_SERVER", dtorch::launch::forked_main_of(dtorch::tools::run_command_line), 10);
  } catch (const dtorch::ConfigError& e) {
    std::cerr << "dtorch: error: " << e.what() << "\n";
    return 1;
  }
  return dtorch::tools::run_command_line(argc, argv);
}
