// ParseFlags: every real-valued flag is refused unless finite (nan and inf parse as doubles and would
// pass a range check written as "v < lo || v > hi"), in one line naming the flag.
#include "common/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(double, flags_test_real, 1.0, "a real-valued flag");
ABSL_FLAG(float, flags_test_float, 1.0f, "a float flag");
ABSL_FLAG(int, flags_test_int, 1, "an integer flag");

namespace stagehand {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<ParsedFlags> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(ParseFlags, NonFiniteReal_RefusedNamingTheFlag) {
  for (const std::string v : {"nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999"}) {
    absl::StatusOr<ParsedFlags> p = Parse({"--flags_test_real=" + v});
    ASSERT_FALSE(p.ok()) << v;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("--flags_test_real=" + v + ": not a finite number"));
  }
  absl::StatusOr<ParsedFlags> f = Parse({"--flags_test_float", "nan"});
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("--flags_test_float=nan: not a finite number"));
}

TEST(ParseFlags, FiniteReal_Parses) {
  absl::StatusOr<ParsedFlags> p = Parse({"--flags_test_real=2.5e-3", "--flags_test_float=-4", "--flags_test_int=7"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(absl::GetFlag(FLAGS_flags_test_real), 2.5e-3);
  EXPECT_FLOAT_EQ(absl::GetFlag(FLAGS_flags_test_float), -4.0f);
  EXPECT_EQ(p->given.count("flags_test_real"), 1u);
  EXPECT_FALSE(Parse({"--flags_test_real=abc"}).ok());
}

// --help by topic: the groups in their order, sorted within; a group with none of the binary's
// flags left out; a flag of no group under "Other flags", never hidden.
TEST(FlagsHelp, Groups_InOrder_EmptyOnesLeftOut_TheRestUnderOther) {
  const std::string help = FlagsHelp("usage", {"common/flags_test.cc"},
                                     {{"Reals", {"flags_test_real", "flags_test_float"}},
                                      {"Absent", {"no_such_flag"}},
                                      {"Again", {"flags_test_real"}}});
  const size_t reals = help.find("\n\nReals:\n"), other = help.find("\n\nOther flags:\n");
  ASSERT_NE(reals, std::string::npos) << help;
  ASSERT_NE(other, std::string::npos) << help;
  EXPECT_EQ(help.find("Absent"), std::string::npos) << help;
  EXPECT_EQ(help.find("Again"), std::string::npos) << help;  // a flag is shown once, in its first group
  EXPECT_LT(help.find("--flags_test_float"), help.find("--flags_test_real")) << help;
  EXPECT_LT(help.find("--flags_test_real"), other) << help;
  EXPECT_GT(help.find("--flags_test_int"), other) << help;
  EXPECT_EQ(help.rfind("usage", 0), 0u) << help;
}

}  // namespace
}  // namespace stagehand
