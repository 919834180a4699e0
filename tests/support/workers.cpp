// Worker registry and rank runner for multi-rank tests (see workers.h).
#include "support/workers.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "dtorch/core/paths.h"
#include "dtorch/launch/launcher.h"

namespace dtorch::testing {
namespace {

std::map<std::string, WorkerFn>& registry() {
  static std::map<std::string, WorkerFn> r;
  return r;
}

std::string self_exe() {
  return paths::executable_path();
}

}  // namespace

bool register_worker(const std::string& name, WorkerFn fn) {
  registry()[name] = std::move(fn);
  return true;
}

int maybe_run_worker(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "--dtorch-worker") return -1;
  auto it = registry().find(argv[2]);
  if (it == registry().end()) {
    std::cerr << "no test worker named " << argv[2] << "\n";
    return 2;
  }
  try {
    it->second(std::vector<std::string>(argv + 3, argv + argc));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "worker " << argv[2] << " failed: " << e.what() << "\n";
    return 1;
  }
}

int run_ranks(int n, const std::string& name, const std::vector<std::string>& args,
              double timeout_seconds) {
  launch::LaunchOptions o;
  o.nproc_per_node = n;
  o.standalone = true;
  o.timeout_seconds = timeout_seconds;
  o.command = {self_exe(), "--dtorch-worker", name};
  o.command.insert(o.command.end(), args.begin(), args.end());
  o.env["OMP_NUM_THREADS"] = "1";
  return launch::run(o);
}

std::string scratch_dir(const std::string& name) {
  const std::string p =
      paths::join(DTORCH_BINARY_DIR, "test-scratch", name + "-" + std::to_string(getpid()));
  paths::remove_all(p);
  paths::create_directories(p);
  return p;
}

}  // namespace dtorch::testing
