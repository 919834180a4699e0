// A private Slurm cluster for tests: slurmctld and slurmd of Debian's slurm-wlm on 127.0.0.1,
// with their own config, ports and state in a temporary directory, torn down when it goes away.
#pragma once

#include <string>
#include <vector>

#include "support/command.h"

namespace dtorch::testing {

class SlurmCluster {
 public:
  /// Why no cluster can be started here (daemons not installed, not root), or "".
  static std::string unavailable();

  /// Writes slurm.conf for one node "localhost" with `cpus` CPUs (more than the machine has is
  /// fine: slurmd takes the configured count) and starts both daemons; wait_ready() before use.
  explicit SlurmCluster(int cpus = 8);
  /// Cancels every job, waits for them to end, stops both daemons and removes the directory.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  /// Waits (at most `limit` seconds) for the node to be idle; false with the logs in *why.
  bool wait_ready(double limit, std::string* why);
  /// Runs a Slurm client (sbatch, srun, ...; found in /usr/bin) against this cluster.
  CommandResult run(const std::string& name, std::vector<std::string> argv, double limit,
                    std::vector<std::string> env = {});
  /// The first job id; the ids count up from it, and 20000 + id % 10000 is free for each.
  int first_job_id() const { return first_job_id_; }
  std::string conf() const { return dir_ + "/slurm.conf"; }
  /// The tail of both daemons' logs, for failure messages.
  std::string logs() const;

 private:
  std::string dir_;
  int first_job_id_ = 1;
  Command ctld_, slurmd_;
};

}  // namespace dtorch::testing
