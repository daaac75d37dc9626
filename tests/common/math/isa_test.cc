#include "common/math/isa.h"

#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::math {
namespace {

TEST(IsaTest, NamesRoundTripForEveryBuiltLevel) {
  ASSERT_FALSE(BuiltIsas().empty());
  for (Isa isa : BuiltIsas()) {
    absl::StatusOr<Isa> parsed = ParseIsa(IsaName(isa));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(IsaName(Isa::kX86_64_V3), "x86-64-v3");
  EXPECT_EQ(IsaName(Isa::kX86_64_V4), "x86-64-v4");
  EXPECT_EQ(IsaListName({Isa::kX86_64_V3, Isa::kX86_64_V4}), "x86-64-v3, x86-64-v4");
}

TEST(IsaTest, UnknownNameIsInvalidArgumentListingTheBuiltLevels) {
  absl::StatusOr<Isa> parsed = ParseIsa("avx2");
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'avx2'"), std::string::npos);
  EXPECT_NE(parsed.status().message().find(IsaName(BuiltIsas().front())), std::string::npos);
}

TEST(IsaTest, BuiltLevelsAreIncreasingAndSupportedOnesAreASubset) {
  const std::vector<Isa>& built = BuiltIsas();
  for (size_t i = 1; i < built.size(); ++i) {
    EXPECT_LT(static_cast<int>(built[i - 1]), static_cast<int>(built[i]));
  }
  for (Isa isa : SupportedIsas()) {
    EXPECT_TRUE(CpuSupportsIsa(isa)) << IsaName(isa);
    EXPECT_NE(std::find(built.begin(), built.end(), isa), built.end()) << IsaName(isa);
  }
  EXPECT_TRUE(CpuSupportsIsa(Isa::kGeneric));
}

TEST(IsaTest, CapLimitsTheSupportedLevels) {
  const std::vector<Isa> all = SupportedIsas();
  ASSERT_FALSE(all.empty()) << "this CPU runs none of the built levels";
  absl::StatusOr<Isa> best = HighestSupportedIsa();
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, all.back());
  EXPECT_EQ(DefaultIsa(), all.back());
  // Capped at the lowest supported level, only that one remains.
  const std::vector<Isa> capped = SupportedIsas(all.front());
  EXPECT_EQ(capped, std::vector<Isa>{all.front()});
  absl::StatusOr<Isa> capped_best = HighestSupportedIsa(all.front());
  ASSERT_TRUE(capped_best.ok());
  EXPECT_EQ(*capped_best, all.front());
}

TEST(IsaTest, CapBelowEveryBuiltLevelIsFailedPrecondition) {
  if (BuiltIsas().front() == Isa::kGeneric) GTEST_SKIP() << "generic is below every cap";
  absl::StatusOr<Isa> none = HighestSupportedIsa(Isa::kGeneric);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("at or below generic"), std::string::npos);
}

TEST(IsaTest, PickCommonTakesTheHighestLevelEveryProcessRuns) {
  const Isa v3 = Isa::kX86_64_V3;
  const Isa v4 = Isa::kX86_64_V4;
  absl::StatusOr<Isa> both = PickCommonIsa({{v3, v4}, {v3, v4}});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(*both, v4);
  absl::StatusOr<Isa> one_avx2 = PickCommonIsa({{v3, v4}, {v3}, {v3, v4}});
  ASSERT_TRUE(one_avx2.ok());
  EXPECT_EQ(*one_avx2, v3);
  absl::StatusOr<Isa> capped = PickCommonIsa({{v3, v4}, {v3, v4}}, v3);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(*capped, v3);
  absl::StatusOr<Isa> disjoint = PickCommonIsa({{v4}, {v3}});
  ASSERT_EQ(disjoint.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(disjoint.status().message().find("[x86-64-v4], [x86-64-v3]"), std::string::npos)
      << disjoint.status();
  EXPECT_EQ(PickCommonIsa({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PickCommonIsa({{}}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain::math
