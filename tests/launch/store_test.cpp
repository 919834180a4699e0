// Tests for the rendezvous store: served and joined on 127.0.0.1 with libuv where the LibTorch
// has it and the classic server otherwise or on request (Note [TCPStore backend]).
#include "dtorch/launch/store.h"

#include <gtest/gtest.h>
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

}  // namespace
}  // namespace dtorch::launch
