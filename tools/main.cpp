// Entry point of the `dtorch` command line: parses the subcommand and turns every error into
// one clear message and a non-zero exit code. Library code never exits; only this does.
#include <iostream>

#include "dtorch/core/error.h"
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
}  // namespace dtorch::tools

int main(int argc, char** argv) {
  dtorch::tools::set_command_line(argc, argv);
  CLI::App app{"dtorch: distributed training for C++ on LibTorch"};
  app.require_subcommand(1);
  int exit_code = 0;
  dtorch::tools::add_launch_command(app, exit_code);
  dtorch::tools::add_train_command(app, exit_code);
  dtorch::tools::add_bench_command(app, exit_code);
  dtorch::tools::add_checkpoint_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dtorch::Error& e) {
    std::cerr << "dtorch: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dtorch: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
