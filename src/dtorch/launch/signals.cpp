// The launcher's temporary signal handlers: a self-pipe wakes its poll() loop; the host's own
// handlers are saved and put back afterwards, and a host SIGCHLD handler keeps being called.
#include "dtorch/launch/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "dtorch/core/error.h"

namespace dtorch::launch {
namespace {

std::atomic<bool> g_active{false};
std::atomic<int> g_write_fd{-1};
std::atomic<int> g_last_signal{0};
std::atomic<int> g_signal_count{0};
std::atomic<int> g_checkpoint_signal{0};
std::atomic<bool> g_checkpoint_asked{false};
struct sigaction g_old_int, g_old_term, g_old_chld, g_old_pipe, g_old_checkpoint;

void on_signal(int sig, siginfo_t* info, void* ctx) {
  int saved_errno = errno;
  if (sig == SIGINT || sig == SIGTERM) {
    g_last_signal.store(sig);
    g_signal_count.fetch_add(1);
  }
  if (sig == g_checkpoint_signal.load()) g_checkpoint_asked.store(true);
  int fd = g_write_fd.load();
  if (fd >= 0) {
    char byte = 0;
    (void)!::write(fd, &byte, 1);  // non-blocking: a full pipe already means "wake up"
  }
  // The host may reap its own children from its SIGCHLD handler; keep that working.
  if (sig == SIGCHLD) {
    if (g_old_chld.sa_flags & SA_SIGINFO) {
      if (g_old_chld.sa_sigaction) g_old_chld.sa_sigaction(sig, info, ctx);
    } else if (g_old_chld.sa_handler != SIG_DFL && g_old_chld.sa_handler != SIG_IGN) {
      g_old_chld.sa_handler(sig);
    }
  }
  errno = saved_errno;
}

}  // namespace

const NameTable<CheckpointSignal>& names(CheckpointSignal) {
  static const NameTable<CheckpointSignal> n{{CheckpointSignal::Usr1, "USR1"},
                                             {CheckpointSignal::Usr2, "USR2"},
                                             {CheckpointSignal::Off, "off"}};
  return n;
}

int signal_number(CheckpointSignal s) {
  switch (s) {
    case CheckpointSignal::Usr1:
      return SIGUSR1;
    case CheckpointSignal::Usr2:
      return SIGUSR2;
    case CheckpointSignal::Off:
      break;
  }
  return 0;
}

SignalWatch::SignalWatch(int checkpoint_signal) : checkpoint_signal_(checkpoint_signal) {
  bool expected = false;
  DTORCH_CHECK(g_active.compare_exchange_strong(expected, true),
               "launch::run is already running in this process; run one "
               "launcher at a time (or start another `dtorch launch` process)");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_active = false;
    DTORCH_FAIL(Error, "launcher: cannot create a pipe (", std::strerror(errno),
                "); raise `ulimit -n`");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_write_fd = write_fd_;
  g_last_signal = 0;
  g_signal_count = 0;
  g_checkpoint_asked = false;
  g_checkpoint_signal = checkpoint_signal;

  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;  // other threads' syscalls just carry on
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  ::sigaction(SIGCHLD, &sa, &g_old_chld);
  if (checkpoint_signal_) ::sigaction(checkpoint_signal_, &sa, &g_old_checkpoint);
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof ignore);
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &g_old_pipe);
}

SignalWatch::~SignalWatch() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGCHLD, &g_old_chld, nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe, nullptr);
  if (checkpoint_signal_) ::sigaction(checkpoint_signal_, &g_old_checkpoint, nullptr);
  g_checkpoint_signal = 0;
  g_write_fd = -1;
  ::close(read_fd_);
  ::close(write_fd_);
  g_active = false;
}

int SignalWatch::take_signal() {
  char buf[64];
  while (::read(read_fd_, buf, sizeof buf) > 0) {
  }
  return g_last_signal.exchange(0);
}

int SignalWatch::signal_count() const {
  return g_signal_count.load();
}

bool SignalWatch::take_checkpoint_request() {
  return g_checkpoint_asked.exchange(false);
}

}  // namespace dtorch::launch
