// Tests for JSON configuration files read key by key (core/json_config.h). The DeepSpeed
// reader's tests (tests/train/deepspeed_config_test.cpp) cover the messages as users see them.
#include "dtorch/core/json_config.h"

#include <gtest/gtest.h>

#include "dtorch/core/error.h"
#include "support/error_of.h"

namespace dtorch::json_config {
namespace {

TEST(JsonConfig, NearestPrefersAKeyHoldingTheWordThenFewestEdits) {
  const Keys known{"warmup_type", "warmup_num_steps", "stage", "zero_optimization"};
  EXPECT_EQ(nearest("warmup_steps", known), "warmup_num_steps") << "words left out";
  EXPECT_EQ(nearest("zero_optimisation", known), "zero_optimization");
  EXPECT_EQ(nearest("stag", known), "stage");
  EXPECT_EQ(nearest("sgate", known), "stage");
}

TEST(JsonConfig, SyntaxErrorsAndDuplicatesNameLineAndColumn) {
  EXPECT_NE(testing::error_of([] {
              parse("{\"a\": 1,\n}", "f.json");
            }).find("f.json:2:1: not valid JSON"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              parse("{\"a\": [1, 2,]}", "f.json");
            }).find("JSON allows no comma before ']': remove the ',' at line 1, column 12"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              parse("{\"a\": {\"b\": 1, \"b\": 2}}", "f.json");
            }).find("the key 'b' appears twice"),
            std::string::npos);
  EXPECT_EQ(parse("{\"a\": {\"b\": 1}, \"c\": {\"b\": 2}}", "f.json")["c"]["b"], 2)
      << "the same key in two objects is fine";
}

TEST(JsonConfig, GettersCheckTypesAndRangesAndAutoIsAbsent) {
  const auto j =
      parse(R"({"n": 2.0, "x": 0.5, "s": "Adam", "auto": "auto", "o": {"k": true}})", "f.json");
  std::vector<std::string> warnings;
  Section top(j, "", "f.json", &warnings);
  EXPECT_EQ(top.integer("n", 0, 3), 2) << "2.0 is whole";
  EXPECT_EQ(top.number("x", 0, 1), 0.5);
  EXPECT_EQ(top.choice("s", {"adam", "sgd"}, /*any_case=*/true), "adam");
  EXPECT_FALSE(top.get("auto"));
  EXPECT_FALSE(top.integer("missing", 0, 1));
  EXPECT_EQ(top.section("o")->boolean("k"), true);
  EXPECT_EQ(top.section("o")->name("k"), "o.k");
  EXPECT_NE(
      testing::error_of([&] { top.integer("x", 0, 1); }).find("f.json: x must be a whole number"),
      std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.number("x", 0, 0.25); }).find("from 0 to 0.25 (got 0.5)"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.choice("s", {"sgd"}); }).find("'Adam' is not one of sgd"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.section("s"); }).find("s must be an object"),
            std::string::npos);
  top.keys({"n", "x", "s", "auto"}, {"o"});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "f.json: o is ignored: dtorch does not implement it");
  EXPECT_NE(testing::error_of([&] {
              top.keys({"n", "x", "s"}, {});
            }).find("unknown key 'auto'"),
            std::string::npos);
}

}  // namespace
}  // namespace dtorch::json_config
