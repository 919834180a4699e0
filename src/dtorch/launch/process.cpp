// Worker processes: fork/exec, process groups, parent-death signal, and wait statuses in words.
// The launcher runs inside a multi-threaded process (LibTorch's pools, the store's server), so
// the child does only async-signal-safe calls between fork and exec (or, for a forked worker,
// before its main: SpawnRequest::forked_main).
#include "dtorch/launch/process.h"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "dtorch/core/env.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace dtorch::launch {
namespace {

// 0 when `path` is an executable file, else the errno that exec would give.
int check_executable(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (::access(path.c_str(), X_OK) != 0) return errno;
  return 0;
}

std::string cannot_run(const std::string& program, int err) {
  std::string msg = "cannot run " + program + ": " + std::strerror(err);
  if (err == ENOENT && program.find('/') == std::string::npos) {
    msg += " (not found on PATH; give its path, e.g. ./" + program + ", or fix PATH)";
  } else if (err == ENOENT) {
    msg += " (check the path; it is relative to the current directory)";
  } else if (err == EACCES) {
    msg += " (make it executable: chmod +x " + program + ")";
  }
  return msg;
}

SpawnError spawn_error(const std::string& program, int err) {
  return SpawnError(cannot_run(program, err), err == ENOENT ? 127 : 126);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// One past the highest descriptor number this process may have. Async-signal-safe.
long fd_limit() {
  struct rlimit rl;
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
             ? static_cast<long>(rl.rlim_cur)
             : 65536;
}

// Marks every descriptor from 3 up close-on-exec, so a worker inherits none of the launcher's
// sockets (the store's listening socket above all). Async-signal-safe.
void cloexec_from_3() {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (long fd = 3, end = fd_limit(); fd < end; ++fd)
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

// Closes every descriptor from 3 up: a forked worker's, which no exec will close.
void close_from_3() {
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;
  for (long fd = 3, end = fd_limit(); fd < end; ++fd)
    ::close(static_cast<int>(fd));
}

// The child's side of spawn() up to exec: own process group, parent-death signal, default
// signal dispositions, and stdin/stdout/stderr in place. Async-signal-safe; false (with errno
// written to status_fd) when a descriptor could not be set.
bool child_setup(pid_t parent, int in_fd, int out_fd, int err_fd, int status_fd) {
  ::setpgid(0, 0);
  // The parent may have died between fork and prctl; then nobody would ever kill us.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s)
    ::sigaction(s, &dfl, nullptr);  // fails harmlessly for some
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) {
    int e = errno;
    (void)!::write(status_fd, &e, sizeof e);
    return false;
  }
  return true;
}

[[noreturn]] void child_exec(const char* path, char* const argv[], char* const envp[], pid_t parent,
                             int in_fd, int out_fd, int err_fd, int status_fd) {
  if (!child_setup(parent, in_fd, out_fd, err_fd, status_fd)) ::_exit(127);
  cloexec_from_3();
  ::execve(path, argv, envp);
  int e = errno;
  (void)!::write(status_fd, &e, sizeof e);  // tells the parent why; closes on exec otherwise
  ::_exit(127);
}

// A forked worker: like child_exec, but the launcher's descriptors are closed rather than
// marked (no exec follows), the environment is the request's, and the worker's main runs here.
[[noreturn]] void child_run(const SpawnRequest& req, char** envp, pid_t parent, int in_fd,
                            int out_fd, int err_fd, int status_fd) {
  if (!child_setup(parent, in_fd, out_fd, err_fd, status_fd)) ::_exit(127);
  close_from_3();  // status_fd too: closed unsent, it tells the parent the worker started
  environ = envp;
  int rc = 1;
  try {
    // OpenMP read OMP_NUM_THREADS when the launcher loaded it; an exec'd worker reads its own.
    if (auto threads = env::get_int("OMP_NUM_THREADS"); threads && *threads > 0)
      at::set_num_threads(static_cast<int>(*threads));
    rc = req.forked_main(req.argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  // No static destructors: they belong to the launcher this process is a copy of.
  std::fflush(nullptr);
  ::_exit(rc);
}

}  // namespace

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (int e = check_executable(program)) throw spawn_error(program, e);
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int err = ENOENT;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    int e = check_executable(candidate);
    if (e == 0) return candidate;
    if (e != ENOENT && e != ENOTDIR) err = e;  // like execvp: report EACCES over "not found"
    start = end + 1;
  }
  throw spawn_error(program, err);
}

Child spawn(const SpawnRequest& req) {
  // Everything the child touches is built before fork: another thread may hold malloc's lock.
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(status, O_CLOEXEC) != 0) {
    int e = errno;
    for (int* fd : {&devnull, &out[0], &out[1], &err[0], &err[1], &status[0], &status[1]})
      close_fd(*fd);
    throw Error(str("cannot start a worker: out of file descriptors (", std::strerror(e),
                    "); raise `ulimit -n` or start fewer workers"));
  }

  // Signals stay blocked across fork so that the child cannot run the launcher's handlers
  // before it has reset them to their defaults.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t parent = ::getpid();
  if (req.forked_main) std::fflush(nullptr);  // else the worker would write our buffers again
  pid_t pid = ::fork();
  if (pid == 0) {
    if (req.forked_main) child_run(req, envp.data(), parent, devnull, out[1], err[1], status[1]);
    child_exec(req.path.c_str(), argv.data(), envp.data(), parent, devnull, out[1], err[1],
               status[1]);
  }
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  for (int* fd : {&devnull, &out[1], &err[1], &status[1]})
    close_fd(*fd);
  if (pid < 0) {
    for (int* fd : {&out[0], &err[0], &status[0]})
      close_fd(*fd);
    throw Error(str("cannot start a worker: fork failed (", std::strerror(fork_errno),
                    "); the machine may be out of memory or processes (ulimit -u)"));
  }
  ::setpgid(pid, pid);  // also here, so a teardown right after spawn already reaches the group

  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close_fd(status[0]);
  if (n > 0) {
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close_fd(out[0]);
    close_fd(err[0]);
    throw spawn_error(req.argv.empty() ? req.path : req.argv[0], exec_errno);
  }
  for (int fd : {out[0], err[0]})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Child{pid, out[0], err[0]};
}

void signal_group(pid_t pgid, int sig) {
  if (pgid > 0) ::kill(-pgid, sig);
}

bool is_stopped(pid_t pid) {
  // "pid (comm) S ...": the state follows the last ')', as comm may hold any character.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string fields((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = fields.rfind(')');
  return close != std::string::npos && close + 2 < fields.size() && fields[close + 2] == 'T';
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string s = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
    if (WCOREDUMP(status)) s += " and dumped core";
    return s;
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace dtorch::launch
