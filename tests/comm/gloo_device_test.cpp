// The address Gloo binds to: the route towards the master, found without sending anything.
#include <gtest/gtest.h>

#include "dtorch/comm/gloo_device.h"

namespace dtorch::comm {
namespace {

TEST(GlooDevice, LocalAddressTowardsLoopbackIsLoopback) {
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");
  std::string local = local_address_towards("localhost");
  EXPECT_TRUE(local == "127.0.0.1" || local == "::1") << local;
}

TEST(GlooDevice, UnresolvableMasterGivesNoAddress) {
  EXPECT_EQ(local_address_towards("no-such-host.invalid"), "");
}

TEST(GlooDevice, AddressTowardsThisHostsOwnAddressIsThatAddress) {
  // Whatever non-loopback address this host has, the route to it starts at it.
  std::string out = local_address_towards("192.0.2.1");  // any routed address (TEST-NET-1)
  if (out.empty()) GTEST_SKIP() << "no route off this host (no default route)";
  EXPECT_EQ(local_address_towards(out), out);
}

}  // namespace
}  // namespace dtorch::comm
