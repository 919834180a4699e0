// The test Slurm cluster: a slurm.conf with auth/none (Slurm 22.05 still has it, so no munge
// daemon is needed), proctrack/linuxproc and task/none (no cgroups), and free ports.
#include "launch/slurm_cluster.h"

#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "dtorch/core/paths.h"

namespace dtorch::testing {
namespace {

using Clock = std::chrono::steady_clock;

bool port_free(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// Job ids whose derived rendezvous ports (Note [Launch environment precedence]) are free now,
// so two test clusters on one machine do not both start at job 1 and share a port.
int pick_first_job_id() {
  for (int tries = 0; tries < 200; ++tries) {
    int id = 1 + static_cast<int>((::getpid() * 7919L + tries * 104729L) % 9990);
    bool ok = true;
    for (int k = 0; k < 5 && ok; ++k)
      ok = port_free(20000 + id + k);
    if (ok) return id;
  }
  return 1;
}

void stop(const Command& c) {
  if (c.pid <= 0) return;
  ::kill(c.pid, SIGTERM);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (::waitpid(c.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string tail_of(const std::string& path, size_t n = 3000) {
  std::string s = read_file(path);
  return s.size() > n ? s.substr(s.size() - n) : s;
}

}  // namespace

std::string SlurmCluster::unavailable() {
  for (const char* tool : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd",
                           "/usr/bin/sbatch", "/usr/bin/srun", "/usr/bin/sinfo"}) {
    if (!paths::exists(tool)) return std::string(tool) + " is not installed (Debian: slurm-wlm)";
  }
  if (::geteuid() != 0) return "slurmd must run as root to start job steps";
  return "";
}

SlurmCluster::SlurmCluster(int cpus) {
  // Short and outside the build tree: slurmd puts unix sockets in its spool directory, and
  // their paths must stay under 108 bytes.
  char tmpl[] = "/tmp/dtorch-slurm-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  paths::create_directories(dir_ + "/state");
  paths::create_directories(dir_ + "/spool");
  first_job_id_ = pick_first_job_id();
  const passwd* pw = ::getpwuid(::geteuid());
  std::string user = pw ? pw->pw_name : "root";
  std::ofstream(conf()) << "ClusterName=dtorchtest\n"
                        << "SlurmctldHost=localhost(127.0.0.1)\n"
                        << "SlurmctldPort=" << free_port() << "\n"
                        << "SlurmdPort=" << free_port() << "\n"
                        << "SlurmUser=" << user << "\nSlurmdUser=" << user << "\n"
                        << "AuthType=auth/none\nCredType=cred/none\n"
                        // A requeued job waits this long to run again (120 s by default).
                        << "AuthInfo=cred_expire=5\n"
                        // How long a cancelled or requeued step may take to end before it is
                        // killed; srun waits this long (30 s by default) after a requeue.
                        << "KillWait=2\n"
                        // A requeued job becomes eligible when cred_expire has passed, which
                        // only the periodic scheduler pass notices (every 60 s by default).
                        << "SchedulerParameters=sched_interval=2\n"
                        << "StateSaveLocation=" << dir_ << "/state\n"
                        << "SlurmdSpoolDir=" << dir_ << "/spool\n"
                        << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
                        << "SlurmdPidFile=" << dir_ << "/slurmd.pid\n"
                        << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\n"
                        << "SlurmdLogFile=" << dir_ << "/slurmd.log\n"
                        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
                        // Trust the CPUs declared below over the ones slurmd counts.
                        << "SlurmdParameters=config_overrides\n"
                        << "MpiDefault=none\nReturnToService=2\nSwitchType=switch/none\n"
                        << "JobCompType=jobcomp/none\nJobAcctGatherType=jobacct_gather/none\n"
                        << "AccountingStorageType=accounting_storage/none\n"
                        << "FirstJobId=" << first_job_id_ << "\n"
                        << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=" << cpus
                        << " RealMemory=1000 State=UNKNOWN\n"
                        << "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE "
                        << "State=UP\n";
  std::vector<std::string> env{"SLURM_CONF=" + conf()};
  paths::create_directories(dir_ + "/ctld-out");
  paths::create_directories(dir_ + "/slurmd-out");
  // -D: stay in the foreground, so these pids are the daemons'; -i: no saved state.
  ctld_ = start_command(dir_ + "/ctld-out", {"/usr/sbin/slurmctld", "-D", "-i"}, env);
  slurmd_ = start_command(dir_ + "/slurmd-out", {"/usr/sbin/slurmd", "-D", "-N", "localhost"}, env);
}

bool SlurmCluster::wait_ready(double limit, std::string* why) {
  auto deadline = Clock::now() + std::chrono::duration<double>(limit);
  std::string state;
  while (Clock::now() < deadline) {
    auto r = run("sinfo", {"sinfo", "-h", "-n", "localhost", "-o", "%t"}, 10);
    state = r.out;
    if (r.exit_code() == 0 && state.rfind("idle", 0) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  *why = "the Slurm node did not become idle within " + std::to_string(limit) +
         " s (sinfo: " + state + ")\n" + logs();
  return false;
}

CommandResult SlurmCluster::run(const std::string& name, std::vector<std::string> argv,
                                double limit, std::vector<std::string> env) {
  argv[0] = "/usr/bin/" + argv[0];
  env.push_back("SLURM_CONF=" + conf());
  std::string out = dir_ + "/cmd-" + name;
  paths::create_directories(out);
  return finish_command(start_command(out, argv, env), limit);
}

std::string SlurmCluster::logs() const {
  return "--- slurmctld.log\n" + tail_of(dir_ + "/slurmctld.log") + "--- slurmd.log\n" +
         tail_of(dir_ + "/slurmd.log") + "--- slurmctld stderr\n" +
         tail_of(dir_ + "/ctld-out/stderr") + "--- slurmd stderr\n" +
         tail_of(dir_ + "/slurmd-out/stderr");
}

SlurmCluster::~SlurmCluster() {
  // Jobs first, so slurmd can end their steps while it still runs.
  const passwd* pw = ::getpwuid(::geteuid());
  run("scancel", {"scancel", "--quiet", std::string("--user=") + (pw ? pw->pw_name : "root")}, 10);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    auto r = run("squeue", {"squeue", "-h", "-o", "%i"}, 10);
    if (r.exit_code() != 0 || r.out.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stop(slurmd_);
  stop(ctld_);
  std::error_code ec;
  paths::remove_all(dir_, ec);
}

}  // namespace dtorch::testing
