// torchrun's rendezvous flags as values: endpoints, --rdzv-conf keys, node ranges, and the
// errors that name the flag.
#include "dtorch/launch/rdzv_options.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "support/error_of.h"

namespace dtorch::launch {
namespace {

TEST(RdzvOptions, EndpointsWithAndWithoutPorts) {
  EXPECT_EQ(parse_endpoint("node1:29500", 29400).host, "node1");
  EXPECT_EQ(parse_endpoint("node1:29500", 29400).port, 29500);
  EXPECT_EQ(parse_endpoint("10.0.0.7", 29400).port, 29400);
  Endpoint v6 = parse_endpoint("[::1]:1234", 29400);
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 1234);
  EXPECT_EQ(parse_endpoint("[fe80::1]", 7).port, 7);
  EXPECT_NE(testing::error_of([] { parse_endpoint("host:99999", 1); }).find("not in 1..65535"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_endpoint(":29500", 1); }).find("names no host"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_endpoint("a:b:c", 1); }).find("[ADDR]:PORT"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_endpoint("host:", 1); }).find("is not a whole number"),
            std::string::npos);
}

TEST(RdzvOptions, ConfKeysInTorchrunsNames) {
  RdzvConf c = parse_rdzv_conf(
      "join_timeout=20,last_call_timeout=1.5,close_timeout=3,keep_alive_interval=0.5,"
      "keep_alive_max_attempt=4,read_timeout=60");
  EXPECT_EQ(c.join_timeout, 20);
  EXPECT_TRUE(c.join_timeout_given);
  EXPECT_EQ(c.last_call_timeout, 1.5);
  EXPECT_EQ(c.close_timeout, 3);
  EXPECT_EQ(c.lost_after(), 2.0);
  RdzvConf d = parse_rdzv_conf("");
  EXPECT_EQ(d.join_timeout, 600);
  EXPECT_FALSE(d.join_timeout_given);
  EXPECT_EQ(d.lost_after(), 15);
  std::string unknown = testing::error_of([] { parse_rdzv_conf("join_timout=5"); });
  EXPECT_NE(unknown.find("unknown key 'join_timout'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("join_timeout, last_call_timeout"), std::string::npos) << unknown;
  EXPECT_NE(testing::error_of([] { parse_rdzv_conf("join_timeout=-1"); }).find("above 0"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_rdzv_conf("join_timeout"); }).find("is not key=value"),
            std::string::npos);
}

TEST(RdzvOptions, NodeRangesAndBackends) {
  EXPECT_EQ(parse_node_range("4").min, 4);
  EXPECT_EQ(parse_node_range("4").max, 4);
  NodeRange r = parse_node_range("2:3");
  EXPECT_EQ(r.min, 2);
  EXPECT_EQ(r.max, 3);
  EXPECT_NE(testing::error_of([] { parse_node_range("3:2"); }).find("MIN 3 is more than MAX 2"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_node_range("0"); }).find("at least 1"), std::string::npos);
  EXPECT_NE(
      testing::error_of([] { parse_node_range("x"); }).find("--nnodes=x is not a whole number"),
      std::string::npos);
  EXPECT_EQ(parse_rdzv_backend("c10d"), RdzvBackend::C10d);
  EXPECT_EQ(parse_rdzv_backend("static"), RdzvBackend::Static);
  EXPECT_NE(testing::error_of([] { parse_rdzv_backend("etcd-v2"); }).find("needs no etcd"),
            std::string::npos);
}

}  // namespace
}  // namespace dtorch::launch
