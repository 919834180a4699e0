// Starting, signalling and describing worker processes for the launcher: fork/exec with the
// safety a multi-threaded host process needs, and exit statuses turned into words.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "dtorch/core/error.h"

namespace dtorch::launch {

/// A worker could not be started (exec failed). exit_code() is what a shell would exit with:
/// 127 when the program does not exist, 126 when it exists but cannot be run.
class SpawnError : public Error {
 public:
  SpawnError(const std::string& msg, int exit_code) : Error(msg), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

/// Where `program` runs from: itself when it contains a '/', else the first executable file of
/// that name on PATH (like execvp). Throws SpawnError "cannot run PROGRAM: ..." when none.
std::string resolve_program(const std::string& program);

struct SpawnRequest {
  std::string path;               ///< executable, as resolve_program returned it
  std::vector<std::string> argv;  ///< argv[0] is the program as the user wrote it
  std::vector<std::string> env;   ///< the complete environment, "NAME=value" each
};

/// A started worker. Its pid is also its process group id.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;  ///< read end of its stdout pipe (non-blocking, close-on-exec)
  int err_fd = -1;  ///< read end of its stderr pipe (non-blocking, close-on-exec)
};

/// Starts one worker: own process group (so a teardown reaches the processes it starts too),
/// stdin from /dev/null, stdout/stderr into pipes, default signal dispositions, no inherited
/// descriptors, and SIGKILL when the thread that started it dies (PR_SET_PDEATHSIG), so no
/// worker outlives a crashed launcher. Throws SpawnError when exec fails.
Child spawn(const SpawnRequest& req);

/// Sends `sig` to the worker's whole process group; a group that is already gone is fine.
void signal_group(pid_t pgid, int sig);

/// Whether process `pid` of this host is stopped (SIGSTOP, ^Z: state T in /proc/PID/stat).
bool is_stopped(pid_t pid);

/// "SIGKILL" for 9; "signal 42" for one without a name.
std::string signal_name(int sig);
/// A waitpid status in words: "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status);
/// The exit code a shell would report for the status: the code, or 128 + signal.
int exit_code_of(int status);

}  // namespace dtorch::launch
