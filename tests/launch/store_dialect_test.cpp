// Note [TCPStore dialects]: a dtorch worker whose store is served by the other PyTorch
// generation (torchrun 2.x's agent store with a dtorch built on LibTorch 1.13, and the other way)
// is told so within seconds, both versions named, where LibTorch's client waited forever or
// retried for minutes. The store is a real one, served by the other PyTorch in Python.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <signal.h>

#include <cstdio>
#include <memory>

#include "dtorch/core/paths.h"
#include "dtorch/launch/store_probe.h"
#include "support/command.h"
#include "support/workers.h"

namespace dtorch {
namespace {

using testing::contains;

// A Python whose torch is the other generation than this build's LibTorch, or "".
std::string python_of_the_other_pytorch() {
  const bool mine_is_1 = TORCH_VERSION_MAJOR < 2;
  const std::string candidate =
      mine_is_1 ? std::string(DTORCH_SOURCE_DIR) + "/.venv/bin/python" : "/usr/bin/python3";
  // The installed package's version, without importing it (a second of CPU or more).
  const std::string probe =
      candidate + " -c 'import importlib.metadata as m; print(m.version(\"torch\"))' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(probe.c_str(), "r"), ::pclose);
  char version[64] = {0};
  if (!p || !std::fgets(version, sizeof version, p.get())) return "";
  return (version[0] == '1') != mine_is_1 ? candidate : "";
}

TEST(PythonStoreOfAnotherPyTorch, AWorkerNamesBothVersionsWithinSeconds) {
  const std::string python = python_of_the_other_pytorch();
  if (python.empty()) GTEST_SKIP() << "no Python with the other PyTorch generation here";
  const std::string dir = testing::scratch_dir("store-dialect");
  const int port = testing::free_port();
  paths::create_directories(dir + "/server");
  auto server = testing::start_command(
      dir + "/server",
      {python, "-c",
       "import sys, time, datetime, torch.distributed as d\n"
       "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), 2, True, datetime.timedelta(seconds=60), "
       "False)\n"
       "s.set('ready', '1')\n"
       "print('SERVING', flush=True)\n"
       "time.sleep(60)\n",
       std::to_string(port)});
  ASSERT_TRUE(testing::wait_until(
      [&] { return contains(testing::read_file(dir + "/server/stdout"), "SERVING"); }, 60))
      << testing::read_file(dir + "/server/stderr");

  const auto mine =
      TORCH_VERSION_MAJOR < 2 ? launch::StoreDialect::Torch1 : launch::StoreDialect::Torch2;
  EXPECT_NE(launch::probe_store_dialect("127.0.0.1", port, mine), mine);
  EXPECT_NE(launch::probe_store_dialect("127.0.0.1", port, mine), launch::StoreDialect::Unknown);

  const auto r =
      testing::run_second_worker("store-dialect-worker", port, 30, {"DTORCH_TIMEOUT=20"});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_LT(r.seconds, 15) << r.err;
  EXPECT_TRUE(contains(r.err, TORCH_VERSION_MAJOR < 2 ? "speaks PyTorch 2.x's TCPStore protocol"
                                                      : "speaks PyTorch 1.x's TCPStore protocol"))
      << r.err;
  EXPECT_TRUE(contains(r.err, std::string("built on LibTorch ") + TORCH_VERSION)) << r.err;
  EXPECT_FALSE(contains(r.err, "frame #")) << r.err;
  ::kill(server.pid, SIGKILL);
  testing::finish_command(server, 120);  // counted from its start
}

}  // namespace
}  // namespace dtorch
