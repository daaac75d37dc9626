#include "common/util/busy_load.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/cpu_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::util {
namespace {

using ::testing::HasSubstr;

TEST(BusyLoadTest, CountsWorkOnEveryCpuAndStopsOnce) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  absl::StatusOr<std::unique_ptr<BusyLoad>> load = BusyLoad::Start(allowed);
  ASSERT_TRUE(load.ok()) << load.status();
  const double rate = (*load)->Stop();
  EXPECT_GT(rate, 0);
  EXPECT_EQ((*load)->Stop(), rate);
  EXPECT_EQ(AllowedCpus(), allowed);  // the caller is not confined.
}

TEST(BusyLoadTest, RefusesNoCpuARepeatedOneAndOneOutsideTheProcess) {
  const std::vector<int> allowed = AllowedCpus();
  EXPECT_EQ(BusyLoad::Start({}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status twice = BusyLoad::Start({allowed[0], allowed[0]}).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("twice"));
  int outside = kMaxCpus - 1;
  while (outside >= 0 && std::binary_search(allowed.begin(), allowed.end(), outside)) --outside;
  absl::Status status = BusyLoad::Start({outside}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("CPU ", outside, " is not available")));
}

}  // namespace
}  // namespace pipetrain::util
