// Tests for the rendezvous store: served and joined on 127.0.0.1 with libuv where the LibTorch
// has it and the classic server otherwise or on request (Note [TCPStore backend]).
#include "dtorch/launch/store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dtorch/core/error.h"
#include "launch/scoped_env.h"
#include "support/command.h"

namespace dtorch::launch {
namespace {

using std::chrono::seconds;

void expect_round_trip(const c10::intrusive_ptr<c10d::Store>& server) {
  auto client = connect_store("127.0.0.1", served_port(server), seconds(10));
  client->set("from-client", std::vector<uint8_t>{1, 2, 3});
  EXPECT_EQ(server->get("from-client"), (std::vector<uint8_t>{1, 2, 3}));
  server->set("from-server", std::vector<uint8_t>{4});
  EXPECT_EQ(client->get("from-server"), (std::vector<uint8_t>{4}));
  EXPECT_EQ(client->add("counter", 2), 2);
  EXPECT_EQ(server->add("counter", 3), 5);
}

TEST(Store, ServedWithLibuvWhereTheLibTorchHasIt) {
  testing::ScopedEnv env;
  env.unset("USE_LIBUV");
  auto server = serve_store(0, 2, seconds(10));
  EXPECT_EQ(served_by_libuv(server), kStoreHasLibuv);
  expect_round_trip(server);
}

TEST(Store, UseLibuv0AsksForTheClassicServer) {
  testing::ScopedEnv env;
  env.set("USE_LIBUV", "0");
  auto server = serve_store(0, 2, seconds(10));
  EXPECT_FALSE(served_by_libuv(server));
  expect_round_trip(server);
}

TEST(Store, PortInUseAndUnreachableStoreAreNamed) {
  auto server = serve_store(0, 2, seconds(10));
  const int port = served_port(server);
  try {
    serve_store(port, 2, seconds(2));
    ADD_FAILURE() << "a second store on port " << port << " was served";
  } catch (const CommError& e) {
    EXPECT_TRUE(testing::contains(e.what(), std::to_string(port))) << e.what();
    EXPECT_TRUE(testing::contains(e.what(), "--master-port")) << e.what();
  }
  server.reset();  // nobody serves that port any more
  try {
    connect_store("127.0.0.1", port, std::chrono::milliseconds(1500));
    ADD_FAILURE() << "connected to a store nobody serves";
  } catch (const CommError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "127.0.0.1:" + std::to_string(port))) << e.what();
  }
}

// A port that accepts connections (the kernel completes them from the backlog) and never
// answers: a stopped store server, or a program on the port that is not a store.
class SilentPort {
 public:
  SilentPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 16) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("SilentPort: cannot listen on 127.0.0.1");
    port_ = ntohs(a.sin_port);
  }
  ~SilentPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// Note [Store watchdog]: a worker whose store never answers says what it waits for after 10 s
// and ends, naming the store, when the wait outlives its timeout, on either LibTorch (1.13's
// client alone would wait forever).
TEST(Store, AWorkerWhoseStoreNeverAnswersEndsWithinItsTimeout) {
  SilentPort silent;
  const std::string where = "127.0.0.1:" + std::to_string(silent.port());
  const auto r =
      testing::run_second_worker("store-silent-worker", silent.port(), 60, {"DTORCH_TIMEOUT=12"});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  // The dialect probes (at most 4 s), the timeout, the watchdog's grace past it (3 s for a call,
  // 10 s for LibTorch 2.x's handshake, where this one waits), and slack.
  EXPECT_LT(r.seconds, 4 + 12 + 10 + 5) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "waiting 1")) << r.err;  // "waiting 10 s so far ..."
  EXPECT_TRUE(testing::contains(r.err, where)) << r.err;
  EXPECT_TRUE(testing::contains(r.err, "DTORCH_TIMEOUT")) << r.err;
  EXPECT_FALSE(testing::contains(r.err, "frame #")) << r.err;
}

}  // namespace
}  // namespace dtorch::launch
