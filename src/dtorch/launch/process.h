// Starting, signalling and describing worker processes for the launcher: fork/exec with the
// safety a multi-threaded host process needs, and exit statuses turned into words.
#pragma once

#include <sys/types.h>

#include <array>
#include <functional>
#include <optional>
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

// Note [Forked workers]
// Exec'ing a program that links LibTorch costs about half a second of CPU before its main()
// (LibTorch registering its operators, the dynamic linker binding their symbols). For a test
// suite of small multi-rank runs that was most of the CPU its workers took, so a launcher can
// instead run each worker's main in a fork of itself (LaunchOptions::forked_main). Two rules
// make such a copy as good as a fresh process:
// - The launcher is a fresh copy of the worker's program: nothing a worker uses is half-done or
//   spent in it. Not after the process used CUDA (a forked child cannot), ran backward
//   (autograd then refuses it in a child) or ran OpenMP or LibTorch pools wider than a thread.
// - No other thread of the launcher is busy when it forks: a child gets a copy of every lock
//   held at that instant, and no thread to release it. A launcher's store serves its workers'
//   handshakes from a thread of its own while the later workers start (a worker forked then
//   once waited for good in its own handshake), and the store watchdog's thread wakes every
//   second. So the launcher forks its workers ahead (WorkerForks), as it starts, before the
//   store or anything else has started a thread; each fork waits for the worker's command line,
//   environment and standard streams, sent over a socket as the worker starts. A restart or an
//   elastic job's next round exec's its workers: they would be forked from a busy launcher.
// Users: dtorch's test binary forks a rank server at the start of main(), before anything ran,
// and each multi-rank test's launcher is a fresh fork of that server (tests/support/workers.cpp);
// `dtorch train|bench|plan --nproc-per-node N`, and `dtorch launch` when its program is that
// same `dtorch`, fork their workers when DTORCH_FORK_WORKERS=1 (the test suite sets it; the
// launcher has then only parsed flags and files on a CPU).
// A forked worker keeps what an exec'd one had (own process group, torchrun's environment, its
// output relayed, SIGKILL when the launcher dies, none of the launcher's descriptors) but for
// /proc/PID/environ and cmdline, which stay the launcher's. OpenMP read OMP_NUM_THREADS when
// the launcher loaded it: the worker's own value is set again before its main.

/// A worker's main function, for workers forked rather than exec'd (Note [Forked workers]).
using ForkedMain = std::function<int(const std::vector<std::string>& argv)>;

/// The ForkedMain that runs a program's main(argc, argv) on the command line sent.
ForkedMain forked_main_of(int (*main)(int argc, char** argv));

class WorkerForks;

struct SpawnRequest {
  std::string path;               ///< executable, as resolve_program returned it
  std::vector<std::string> argv;  ///< argv[0] is the program as the user wrote it
  std::vector<std::string> env;   ///< the complete environment, "NAME=value" each
  /// When one of these forks is left, the worker is that fork instead of an exec of `path`.
  WorkerForks* forks = nullptr;
};

/// A started worker. Its pid is also its process group id.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;  ///< read end of its stdout pipe (non-blocking, close-on-exec)
  int err_fd = -1;  ///< read end of its stderr pipe (non-blocking, close-on-exec)
};

/// Processes forked ahead, each waiting to become one worker that runs `main` (Note [Forked
/// workers]): made while this process has no other busy thread; spawn() uses them in turn.
class WorkerForks {
 public:
  /// Forks `n` waiting processes now (fewer when fork fails: spawn() exec's the rest).
  WorkerForks(int n, ForkedMain main);
  /// Ends and reaps the forks no worker used.
  ~WorkerForks();
  WorkerForks(const WorkerForks&) = delete;
  WorkerForks& operator=(const WorkerForks&) = delete;

  /// Makes the next waiting fork the worker `req` describes: it takes req.env as its
  /// environment, runs main(req.argv) and exits with what that returns. None when no fork is
  /// left.
  std::optional<Child> start(const SpawnRequest& req);

 private:
  struct Waiting {
    pid_t pid;
    int fd;  // our end of the socket it reads its request from
  };
  std::vector<Waiting> waiting_;
};

/// Starts one worker: own process group (so a teardown reaches the processes it starts too),
/// stdin from /dev/null, stdout/stderr into pipes, default signal dispositions, no inherited
/// descriptors, and SIGKILL when the thread that started it dies (PR_SET_PDEATHSIG), so no
/// worker outlives a crashed launcher. Throws SpawnError when exec fails.
Child spawn(const SpawnRequest& req);

// Note [Fork server]
// A test suite of command-line tests starts `dtorch` hundreds of times, each start half a second
// of CPU before main() (Note [Forked workers]). A fork server pays it once: a fresh process
// that, before doing anything else, serves requests, each a command line with its environment,
// working directory and standard streams, run in a fork of itself as an exec of the program
// would have run it. Every fork is a copy of the same fresh process (the server runs nothing
// between requests, and has no other thread). The fork's pid goes back on a socket that came
// with the request, and later its wait status, since the server is its parent and reaps it. A
// fork whose client closes that socket first is killed (nobody waits for it). A fork keeps its
// server's process group, and its server's /proc/PID/cmdline and environ. A server listens on
// a name of its own (fork_requests.h), takes a request per connection from processes of this
// user, and ends once idle for a while. `dtorch` is one when DTORCH_FORK_SERVER names it: the
// one every test of a build runs its `dtorch` command lines in (tests/support/command.cpp). The
// test binary is one too, for ctest's tests (Note [Test server] in tests/support/main.cpp).

/// When the environment's `variable` names a fork server, as connect_fork_server (fork_requests.h)
/// starts one: serves as it (Note [Fork server]) and never returns, each request running
/// main(argv) in a fork of this process, until no fork is left and none came for `idle_seconds`
/// (ends at once when another process holds the name). Otherwise returns at once. Call it first
/// in main(), before any thread. Throws ConfigError when `variable` is set by hand (this process
/// was not started as a server).
void serve_forks_when_asked(const char* variable, const ForkedMain& main, double idle_seconds);

/// Makes `env` ("NAME=value" each) this process's whole environment until it ends: for a fork
/// that runs something other than its parent (Note [Forked workers]).
void take_environment(std::vector<std::string> env);

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
