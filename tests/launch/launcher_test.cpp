// launch::run in-process with real small workers (sh, and this test binary as a worker): the
// environment each worker gets, the served store, exit codes, timeouts and bad options.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "dtorch/core/error.h"
#include "dtorch/core/paths.h"
#include "dtorch/launch/launcher.h"
#include "dtorch/launch/process.h"
#include "dtorch/launch/rank_info.h"
#include "dtorch/launch/store.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch::launch {
namespace {

using Clock = std::chrono::steady_clock;

using testing::seconds_since;

LaunchOptions sh_job(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.standalone = true;
  o.grace_seconds = 1;
  o.timeout_seconds = 30;  // a broken launcher fails the test instead of hanging it
  o.command = {"sh", "-c", script};
  return o;
}

std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(Launcher, SetsTorchrunEnvironmentForEachWorker) {
  std::string dir = testing::scratch_dir("launch-env");
  LaunchOptions o = sh_job(2, "env > " + dir + "/env.$LOCAL_RANK");
  o.max_restarts = 2;
  o.run_id = "job42";
  ASSERT_EQ(run(o), 0);
  std::string port;
  for (int r = 0; r < 2; ++r) {
    auto env = read_env_file(dir + "/env." + std::to_string(r));
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(r));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job42");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    if (!std::getenv("OMP_NUM_THREADS")) EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    EXPECT_GT(std::atoi(env["MASTER_PORT"].c_str()), 0);  // --standalone: a free port
    if (r == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port);
  }
}

TEST(Launcher, ExtraEnvReachesWorkersButNotOverTorchrunVariables) {
  std::string dir = testing::scratch_dir("launch-extra-env");
  LaunchOptions o = sh_job(1, "env > " + dir + "/env");
  o.env["DTORCH_TEST_EXTRA"] = "yes";
  o.env["RANK"] = "7";
  ASSERT_EQ(run(o), 0);
  auto env = read_env_file(dir + "/env");
  EXPECT_EQ(env["DTORCH_TEST_EXTRA"], "yes");
  EXPECT_EQ(env["RANK"], "0");
}

// Joins the launcher's store as the real workers of other tests do, and meets every other rank
// there: proves the store is served where MASTER_ADDR/MASTER_PORT say.
DTORCH_TEST_WORKER(launch_store_meet) {
  RankInfo info = rank_info_from_env();
  DTORCH_CHECK(info.launcher_hosts_store, "TORCHELASTIC_USE_AGENT_STORE is not True");
  auto store = connect_store(info.master_addr, info.master_port, std::chrono::seconds(10));
  store->set("rank" + std::to_string(info.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < info.world_size; ++r)
    keys.push_back("rank" + std::to_string(r));
  store->wait(keys, std::chrono::seconds(10));
}

TEST(Launcher, ServesTheRendezvousStoreToWorkers) {
  EXPECT_EQ(testing::run_ranks(2, "launch_store_meet", {}, 30), 0);
}

// What a worker finds when it starts (Note [Forked workers]): its own process group, stdin from
// /dev/null, no descriptor of the launcher's, no blocked signal and default dispositions, and
// torchrun's variables. Writes DIR/rankR: "RANK LOCAL_RANK WORLD_SIZE" or what was wrong.
DTORCH_TEST_WORKER(starts_as_a_worker) {
  const RankInfo info = rank_info_from_env();
  std::string wrong;
  if (::getpgrp() != ::getpid()) wrong += " not-its-own-group";
  std::error_code ec;
  if (paths::read_symlink("/proc/self/fd/0", ec) != "/dev/null") wrong += " stdin";
  for (const std::string& fd : paths::list_directory("/proc/self/fd")) {
    const std::string target = paths::read_symlink("/proc/self/fd/" + fd, ec);
    if (ec) continue;  // the listing's own descriptor, closed by now
    if (std::stoi(fd) > 2) wrong += " fd" + fd + ":" + target;
  }
  sigset_t blocked;
  ::sigprocmask(SIG_BLOCK, nullptr, &blocked);
  struct sigaction term {};
  ::sigaction(SIGTERM, nullptr, &term);
  if (!sigisemptyset(&blocked)) wrong += " blocked-signals";
  if (term.sa_handler != SIG_DFL) wrong += " SIGTERM-handled";
  std::ofstream(args.at(0) + "/rank" + std::to_string(info.rank))
      << (wrong.empty() ? str(info.rank, " ", info.local_rank, " ", info.world_size) : wrong);
}

TEST(Launcher, ForkedWorkersStartAsExecdOnesDo) {
  const std::string dir = testing::scratch_dir("launch-forked");
  paths::create_directories(dir + "/forked");
  paths::create_directories(dir + "/execd");
  // The test binary's ranks are forks of its rank server (tests/support/workers.cpp) ...
  ASSERT_EQ(testing::run_ranks(2, "starts_as_a_worker", {dir + "/forked"}, 30), 0);
  // ... and these are exec'd by a launcher without forked_main.
  LaunchOptions o = sh_job(2, "");
  o.command = {paths::executable_path(), "--dtorch-worker", "starts_as_a_worker", dir + "/execd"};
  ASSERT_EQ(run(o), 0);
  for (const std::string how : {"forked", "execd"}) {
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir + "/" + how + "/rank" + std::to_string(r));
      const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(got, str(r, " ", r, " 2")) << how << " rank " << r;
    }
  }
}

// Waits at most `limit` for `pid` to end; its status, or none (then it is killed and reaped).
std::optional<int> wait_within(pid_t pid, std::chrono::seconds limit) {
  const auto give_up = Clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= give_up) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

// This thread's child processes, as /proc lists them.
std::string children() {
  std::ifstream in(str("/proc/self/task/", ::syscall(SYS_gettid), "/children"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::mutex held_by_another_thread;

// Note [Forked workers]: a worker is a copy of the launcher from before its threads ran, so a
// lock another thread holds as the worker starts (the store's server, serving the workers
// started first) is free in the worker.
TEST(Launcher, ForkedWorkersDoNotInheritLocksHeldAsTheyStart) {
  const std::string before = children();  // the rank server's, say
  {
    WorkerForks forks(2, [](const std::vector<std::string>&) {
      std::lock_guard<std::mutex> lock(held_by_another_thread);
      return 5;
    });
    std::mutex mu;
    std::condition_variable cv;
    bool holding = false, release = false;
    std::thread holder([&] {
      std::lock_guard<std::mutex> held(held_by_another_thread);
      std::unique_lock<std::mutex> lock(mu);
      holding = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return holding; });
    }
    const Child worker = spawn(SpawnRequest{"/bin/true", {"true"}, {}, &forks});
    const std::optional<int> status = wait_within(worker.pid, std::chrono::seconds(10));
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
      cv.notify_all();
    }
    holder.join();
    ::close(worker.out_fd);
    ::close(worker.err_fd);
    ASSERT_TRUE(status.has_value()) << "the worker waited for a lock of the launcher's thread";
    EXPECT_EQ(exit_code_of(*status), 5);
  }
  EXPECT_EQ(children(), before) << "the fork no worker used outlived `forks`";
}

// The forks are made as the launcher starts: a restart exec's its workers, each with its own
// environment and command line either way.
TEST(Launcher, RestartedWorkersAreExecdAfterForkedOnes) {
  const std::string dir = testing::scratch_dir("launch-forked-restart");
  LaunchOptions o = sh_job(2, "echo \"$RANK ${HOW:-execd} $0\" > " + dir +
                                  "/w.$RANK.$TORCHELASTIC_RESTART_COUNT; "
                                  "[ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ] && exit 4; "
                                  "exit 0");
  o.command.push_back("worker-arg");
  o.max_restarts = 1;
  o.forked_main = [](const std::vector<std::string>& argv) {
    ::setenv("HOW", "forked", 1);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    return 127;
  };
  ASSERT_EQ(run(o), 0);
  auto read = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name);
    std::string line;
    std::getline(in, line);
    return line;
  };
  EXPECT_EQ(read("w.1.0"), "1 forked worker-arg");
  EXPECT_EQ(read("w.0.1"), "0 execd worker-arg");
  EXPECT_EQ(read("w.1.1"), "1 execd worker-arg");
}

// The test harness bounds every multi-rank run: 0 would be "no limit" to the launcher.
TEST(Launcher, RunRanksRefusesAnUnboundedRun) {
  EXPECT_THROW(testing::run_ranks(2, "starts_as_a_worker", {}, 0), std::invalid_argument);
}

TEST(Launcher, FailedWorkerStopsTheOthersQuickly) {
  auto t0 = Clock::now();
  int rc = run(sh_job(3, "if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 60"));
  EXPECT_EQ(rc, 3);
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Launcher, SignalledWorkerGives128PlusSignal) {
  EXPECT_EQ(run(sh_job(2, "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60")), 128 + 9);
}

TEST(Launcher, RestartsTheGroupAndWorkersSeeTheCount) {
  LaunchOptions o =
      sh_job(2, "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 4; fi");
  EXPECT_EQ(run(o), 4);  // no restarts allowed
  o.max_restarts = 1;
  EXPECT_EQ(run(o), 0);
}

TEST(Launcher, GivesUpWhenRestartsAreUsedUp) {
  LaunchOptions o = sh_job(1, "exit 6");
  o.max_restarts = 2;
  EXPECT_EQ(run(o), 6);
}

TEST(Launcher, TimeoutStopsTheJob) {
  LaunchOptions o = sh_job(2, "exec sleep 60");
  o.timeout_seconds = 0.5;
  auto t0 = Clock::now();
  EXPECT_EQ(run(o), 124);
  EXPECT_LT(seconds_since(t0), 4.0);
}

TEST(Launcher, ProgramNotFoundIs127) {
  LaunchOptions o = sh_job(2, "");
  o.command = {"dtorch-no-such-program-xyz", "--flag"};
  EXPECT_EQ(run(o), 127);
  o.command = {"./dtorch-no-such-program-xyz"};
  EXPECT_EQ(run(o), 127);
}

TEST(Launcher, RestoresTheHostsSignalHandlers) {
  struct sigaction mine {};
  mine.sa_handler = [](int) {};
  sigemptyset(&mine.sa_mask);
  struct sigaction before_term, before_int, before_chld;
  ASSERT_EQ(::sigaction(SIGTERM, &mine, &before_term), 0);
  ::sigaction(SIGINT, nullptr, &before_int);
  ::sigaction(SIGCHLD, nullptr, &before_chld);
  EXPECT_EQ(run(sh_job(1, "true")), 0);
  struct sigaction after_term, after_int, after_chld;
  ::sigaction(SIGTERM, &before_term, &after_term);  // also puts the original back
  ::sigaction(SIGINT, nullptr, &after_int);
  ::sigaction(SIGCHLD, nullptr, &after_chld);
  EXPECT_EQ(after_term.sa_handler, mine.sa_handler);
  EXPECT_EQ(after_int.sa_handler, before_int.sa_handler);
  EXPECT_EQ(after_chld.sa_handler, before_chld.sa_handler);
}

std::string config_error(const LaunchOptions& o) {
  try {
    run(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Launcher, RejectsBadOptionsWithAFix) {
  LaunchOptions o = sh_job(1, "true");
  o.nproc_per_node = 0;
  EXPECT_NE(config_error(o).find("--nproc-per-node"), std::string::npos);

  o = sh_job(1, "true");
  o.standalone = false;
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_NE(config_error(o).find("--node-rank=2 must be in 0..1"), std::string::npos);

  o = sh_job(1, "true");
  o.command.clear();
  EXPECT_NE(config_error(o).find("no program to run"), std::string::npos);

  o = sh_job(1, "true");
  o.standalone = false;
  o.master_port = 70000;
  EXPECT_NE(config_error(o).find("--master-port=70000"), std::string::npos);

  o = sh_job(1, "true");
  o.nnodes = 2;
  EXPECT_NE(config_error(o).find("--standalone"), std::string::npos);

  o = sh_job(2, "true");
  o.show_ranks = {2};
  EXPECT_NE(config_error(o).find("--show-ranks"), std::string::npos);
}

}  // namespace
}  // namespace dtorch::launch
