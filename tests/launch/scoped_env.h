// A test's private environment: snapshots the whole environment, clears every launcher's
// variables (so tests pass inside srun, mpirun or torchrun too), and puts it all back after.
#pragma once

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

extern char** environ;

namespace dtorch::testing {

class ScopedEnv {
 public:
  ScopedEnv() {
    saved_ = current();
    for (const auto& [name, value] : saved_)
      if (is_launcher_var(name)) ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : current())
      if (!saved_.count(name)) ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_)
      ::setenv(name.c_str(), value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }
  /// Sets every NAME=value line of a recorded environment (as `env` prints it).
  void load(const std::string& recorded) {
    std::istringstream in(recorded);
    for (std::string line; std::getline(in, line);) {
      auto eq = line.find('=');
      if (eq != std::string::npos && eq > 0) set(line.substr(0, eq), line.substr(eq + 1));
    }
  }

  static bool is_launcher_var(const std::string& name) {
    for (const char* prefix : {"SLURM_", "SLURMD_", "PMI_", "PMIX_", "PALS_", "OMPI_", "PBS_",
                               "MPI_LOCAL", "TORCHELASTIC_", "ROLE_", "GROUP_"}) {
      if (name.rfind(prefix, 0) == 0) return true;
    }
    for (const char* n :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      if (name == n) return true;
    }
    return false;
  }

 private:
  static std::map<std::string, std::string> current() {
    std::map<std::string, std::string> env;
    for (char** e = environ; e && *e; ++e) {
      std::string kv(*e);
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    return env;
  }
  std::map<std::string, std::string> saved_;
};

}  // namespace dtorch::testing
