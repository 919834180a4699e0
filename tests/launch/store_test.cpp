// Tests for the rendezvous store: served and joined on 127.0.0.1 with libuv where the LibTorch
// has it and the classic server otherwise or on request (Note [TCPStore backend]).
#include "dtorch/launch/store.h"
#include "dtorch/launch/store_listen.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fstream>
#include <set>
#include <sstream>

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

// Numbers the job's processes exchange through the store are read as numbers only; what a
// stranger wrote there is named, never a library's parse error.
TEST(Store, ANumberThatIsNoneIsNamedWithItsKey) {
  EXPECT_EQ(number_in_store("42", "round"), 42);
  EXPECT_EQ(number_in_store("-1", "node/0"), -1);
  for (const std::string& bad :
       std::vector<std::string>{"", "x", "4 2", std::string(1000, '7') + "x"}) {
    try {
      number_in_store(bad, "rdzv/round");
      ADD_FAILURE() << "read '" << bad << "'";
    } catch (const CommError& e) {
      EXPECT_TRUE(testing::contains(e.what(), "under rdzv/round, which is no number")) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 400u) << "the value is cut short";
    }
  }
}

// Note [Where the store listens]
TEST(PlanListen, AOneNodeStoreListensWhereItsClientsAreSent) {
  EXPECT_EQ(plan_listen("auto", "127.0.0.1", {"127.0.0.1"}, false).address, "127.0.0.1");
  EXPECT_EQ(plan_listen("auto", "localhost", {"127.0.0.1", "::1"}, false).address, "127.0.0.1");
  // Debian's host name, on the loopback: the workers resolve it alike.
  EXPECT_EQ(plan_listen("auto", "node0", {"127.0.1.1"}, false).address, "127.0.1.1");
  EXPECT_EQ(plan_listen("auto", "node0", {"10.0.0.5"}, false).address, "10.0.0.5");
  EXPECT_TRUE(plan_listen("auto", "node0", {"10.0.0.5"}, false).note.empty());
}

TEST(PlanListen, ANodeOfSeveralListensWhereTheOtherNodesReachIt) {
  const ListenPlan reachable = plan_listen("auto", "node0", {"127.0.1.1", "10.0.0.5"}, true);
  EXPECT_EQ(reachable.address, "10.0.0.5");
  EXPECT_TRUE(reachable.note.empty());
  // A name that resolves here to the loopback only: every interface, and why.
  const ListenPlan loopback = plan_listen("auto", "node0", {"127.0.1.1"}, true);
  EXPECT_EQ(loopback.address, "");
  EXPECT_TRUE(testing::contains(loopback.note, "node0 resolves on this host to 127.0.1.1"))
      << loopback.note;
  EXPECT_TRUE(testing::contains(loopback.note, "--rdzv-listen all")) << loopback.note;
  // A loopback address given as such: every node runs on this host.
  EXPECT_EQ(plan_listen("auto", "127.0.0.1", {"127.0.0.1"}, true).address, "127.0.0.1");
  EXPECT_EQ(plan_listen("auto", "localhost", {"127.0.0.1"}, true).address, "127.0.0.1");
  // Another host's name (connecting through it then fails by name).
  EXPECT_EQ(plan_listen("auto", "192.0.2.1", {}, true).address, "");
}

TEST(PlanListen, AllAndAnAddressAreTakenAsGiven) {
  EXPECT_EQ(plan_listen("all", "127.0.0.1", {"127.0.0.1"}, false).address, "");
  EXPECT_TRUE(plan_listen("all", "node0", {"127.0.1.1"}, true).note.empty());
  EXPECT_EQ(plan_listen("10.0.0.5", "node0", {"10.0.0.5"}, true).address, "10.0.0.5");
  try {
    plan_listen("192.0.2.1", "127.0.0.1", {}, false);
    ADD_FAILURE() << "listened on an address of another host";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(),
                                  "--rdzv-listen 192.0.2.1 is not an address or name "
                                  "of this host"))
        << e.what();
  }
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.127.0.1"));
  EXPECT_EQ(local_addresses("127.0.0.1"), std::vector<std::string>{"127.0.0.1"});
  EXPECT_TRUE(local_addresses("192.0.2.1").empty());  // TEST-NET-1: never this host's
}

// The local addresses that listen on `port` (/proc/net/tcp and tcp6), "0.0.0.0" or "::" for
// every interface.
std::set<std::string> listening_on(int port) {
  std::set<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state != "0A") continue;  // LISTEN
      const auto colon = local.rfind(':');
      if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      const std::string hex = local.substr(0, colon);
      if (hex == "0100007F") {
        found.insert("127.0.0.1");
      } else if (hex.find_first_not_of('0') == std::string::npos) {
        found.insert(hex.size() == 8 ? "0.0.0.0" : "::");
      } else {
        found.insert(hex);
      }
    }
  }
  return found;
}

TEST(Store, ListensOnTheAddressItIsGiven) {
  auto loopback = serve_store(0, 2, seconds(10), "127.0.0.1");
  const int port = served_port(loopback);
  if (kStoreListensWhereAsked)
    EXPECT_EQ(listening_on(port), std::set<std::string>{"127.0.0.1"});
  else  // LibTorch 1.13 binds every interface (docs/launch.md says so)
    EXPECT_FALSE(listening_on(port).empty());
  expect_round_trip(loopback);
  auto everywhere = serve_store(0, 2, seconds(10), "");
  const auto all = listening_on(served_port(everywhere));
  EXPECT_TRUE(all.count("0.0.0.0") || all.count("::")) << served_port(everywhere);
  expect_round_trip(everywhere);
}

}  // namespace
}  // namespace dtorch::launch
