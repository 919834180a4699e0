// Tests for JSON configuration files read key by key (core/json_config.h). The DeepSpeed
// reader's tests (tests/train/config/deepspeed_config_test.cpp) cover the messages as users see
// them.
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
  // A NUL byte would end the text for the parser, dropping what follows: an error.
  const std::string with_nul("{\"a\": 1}\n\0{\"b\": 2}", 18);
  const std::string e = testing::error_of([&] { parse(with_nul, "f.json"); });
  EXPECT_NE(e.find("f.json:2:1: a NUL byte at offset 9"), std::string::npos) << e;
}

TEST(JsonConfig, GettersCheckTypesAndRangesAndAutoIsAbsent) {
  const auto j =
      parse(R"({"n": 2.0, "x": 0.5, "s": "Adam", "auto": "auto", "o": {"k": true}, "big": 1e308})",
            "f.json");
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
  // Found by UBSan under FuzzSmoke: 1e308 was converted to int64 before it was checked.
  EXPECT_NE(testing::error_of([&] { top.integer("big", 0, 10); }).find("(got 1e+308)"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.number("x", 0, 0.25); }).find("from 0 to 0.25 (got 0.5)"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.choice("s", {"sgd"}); }).find("'Adam' is not one of sgd"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { top.section("s"); }).find("s must be an object"),
            std::string::npos);
  top.keys({"n", "x", "s", "auto", "big"}, {"o"});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "f.json: o is ignored: dtorch does not implement it");
  EXPECT_NE(testing::error_of([&] {
              top.keys({"n", "x", "s"}, {});
            }).find("unknown key 'auto'"),
            std::string::npos);
}

TEST(JsonConfig, DeepNestingAndHugeNumbersAreErrorsNotCrashes) {
  // Code walking a value recurses per level: 100000 levels overflowed the stack (SIGSEGV).
  for (const std::string open : {"[", "{\"a\":"}) {
    std::string text;
    for (int i = 0; i < 100000; ++i)
      text += open;
    const std::string why = testing::error_of([&] { parse(text, "deep.json"); });
    EXPECT_NE(why.find("deep.json: nests objects and arrays more than 64 deep"), std::string::npos)
        << why;
  }
  std::string ok = "1";
  for (int i = 1; i < kMaxDepth; ++i)
    ok = "[" + ok + "]";
  EXPECT_NO_THROW(parse(ok, "f.json")) << kMaxDepth - 1 << " levels are fine";
  const std::string why = testing::error_of([] { parse(R"({"epochs": 1e400})", "big.json"); });
  EXPECT_NE(why.find("big.json: not valid JSON (number overflow parsing '1e400'): numbers must lie "
                     "within +-1.8e308"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("json.exception"), std::string::npos) << "no library text: " << why;

  nlohmann::json j;
  std::string reason;
  EXPECT_FALSE(try_parse("[[1", &j, &reason));
  EXPECT_EQ(reason.find("[src/"), std::string::npos) << reason;
  EXPECT_NE(reason.find("1:4: not valid JSON"), std::string::npos) << reason;
}

TEST(JsonConfig, WholeNumbersAreCheckedBeforeTheyAreConverted) {
  const auto j = parse(R"([7, 7.0, 7.5, 1e30, -1, 3000000000, "7"])", "f.json");
  EXPECT_EQ(whole_number<int>(j[0], "n"), 7);
  EXPECT_EQ(whole_number<int>(j[1], "n"), 7);
  for (const int i : {2, 3, 5, 6})
    EXPECT_THROW(whole_number<int>(j[i], "n"), std::out_of_range) << j[i];
  EXPECT_THROW(whole_number<uint32_t>(j[4], "n"), std::out_of_range);
  EXPECT_EQ(whole_number<int64_t>(j[5], "n"), 3000000000);
  try {
    whole_number<int64_t>(j[3], "\"numel\"");
    FAIL() << "1e30 is no int64";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(std::string(e.what()),
              "\"numel\" must be a whole number from -9223372036854775808 to 9223372036854775807 "
              "(got 1e+30)");
  }
}

}  // namespace
}  // namespace dtorch::json_config
