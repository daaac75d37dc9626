#include "common/util/cpu_set.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::util {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CpuSetTest, ParsesNumbersAndRangesSortedOnce) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList("0-3,8,10-11");
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_THAT(*cpus, ElementsAre(0, 1, 2, 3, 8, 10, 11));

  cpus = ParseCpuList(" 5 , 2-3 ,3, 4 - 4");
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_THAT(*cpus, ElementsAre(2, 3, 4, 5));

  cpus = ParseCpuList("1023");
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_THAT(*cpus, ElementsAre(1023));
}

TEST(CpuSetTest, RejectsMalformedListsNamingTheItem) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c :
       {Case{"", "empty CPU list"}, Case{"  ", "empty CPU list"}, Case{"1,,2", "empty item"},
        Case{"1,", "empty item"}, Case{"a", "'a' is not a CPU number"},
        Case{"0x1", "'0x1' is not a CPU number"}, Case{"-1", "'' is not a CPU number"},
        Case{"2-", "'2-'"}, Case{"3-1", "'3-1': the range runs backwards"},
        Case{"1024", "CPU 1024 is beyond the highest, 1023"}, Case{"0-5000", "CPU 5000 is beyond"},
        Case{"1-2-3", "'1-2-3'"}}) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(c.text);
    ASSERT_FALSE(cpus.ok()) << "'" << c.text << "'";
    EXPECT_EQ(cpus.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(cpus.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(CpuSetTest, FormatsTheShortestListAndRoundTrips) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({7}), "7");
  EXPECT_EQ(FormatCpuList({5, 1, 2, 3, 3}), "1-3,5");
  EXPECT_EQ(FormatCpuList({0, 2, 4, 5}), "0,2,4-5");
  const std::vector<int> cpus = {0, 1, 2, 3, 8, 10, 11, 40};
  absl::StatusOr<std::vector<int>> parsed = ParseCpuList(FormatCpuList(cpus));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, cpus);
}

TEST(CpuSetTest, ConfinesTheCallingThreadAndTheThreadsItStarts) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_THAT(allowed, testing::Not(IsEmpty()));
  EXPECT_TRUE(std::is_sorted(allowed.begin(), allowed.end()));
  EXPECT_EQ(UsableCpuCount(), static_cast<int>(allowed.size()));
  const int last = allowed.back();

  absl::Status confined;
  std::vector<int> in_thread, in_child;
  int count_in_thread = 0;
  // A thread of its own, so that the test process keeps its mask.
  std::thread t([&] {
    confined = ConfineToCpus({last});
    in_thread = AllowedCpus();
    count_in_thread = UsableCpuCount();
    std::thread child([&] { in_child = AllowedCpus(); });
    child.join();
  });
  t.join();
  ASSERT_TRUE(confined.ok()) << confined;
  EXPECT_THAT(in_thread, ElementsAre(last));
  EXPECT_EQ(count_in_thread, 1);
  EXPECT_THAT(in_child, ElementsAre(last));
  EXPECT_EQ(AllowedCpus(), allowed);  // this thread is untouched.
}

TEST(CpuSetTest, ConfinesToAListOrSaysWhatIsWrongWithIt) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_THAT(allowed, testing::Not(IsEmpty()));
  absl::Status confined, backwards;
  std::vector<int> in_thread;
  std::thread t([&] {
    backwards = ConfineToCpuList("3-1");
    confined = ConfineToCpuList(absl::StrCat(allowed.front()));
    in_thread = AllowedCpus();
  });
  t.join();
  EXPECT_EQ(backwards.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(backwards.message(), HasSubstr("'3-1': the range runs backwards"));
  ASSERT_TRUE(confined.ok()) << confined;
  EXPECT_THAT(in_thread, ElementsAre(allowed.front()));
}

TEST(CpuSetTest, RefusesCpusTheProcessMayNotUse) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_THAT(allowed, testing::Not(IsEmpty()));
  int outside = -1;
  for (int cpu = kMaxCpus - 1; cpu >= 0 && outside < 0; --cpu) {
    if (!std::binary_search(allowed.begin(), allowed.end(), cpu)) outside = cpu;
  }
  ASSERT_GE(outside, 0);
  absl::Status status;
  std::thread t([&] { status = ConfineToCpus({allowed.front(), outside}); });
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("CPU ", outside, " is not available")));
  EXPECT_THAT(status.message(), HasSubstr(FormatCpuList(allowed)));

  std::thread t2([&] { status = ConfineToCpus({}); });
  t2.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AllowedCpus(), allowed);
}

TEST(CpuGroupsTest, ConsecutiveGroupsInOrder) {
  EXPECT_THAT(CpuGroups({0, 1}, 2, 1), ElementsAre(ElementsAre(0), ElementsAre(1)));
  // Gaps in the mask (taskset, a container's cpuset) are skipped; spare CPUs stay unused.
  EXPECT_THAT(CpuGroups({2, 3, 5, 8, 9}, 2, 2), ElementsAre(ElementsAre(2, 3), ElementsAre(5, 8)));
  EXPECT_THAT(CpuGroups({0, 1, 2, 3}, 1, 1), ElementsAre(ElementsAre(0)));
}

TEST(CpuGroupsTest, NothingWhenTheGroupsDoNotFit) {
  EXPECT_THAT(CpuGroups({0, 1}, 4, 1), IsEmpty());
  EXPECT_THAT(CpuGroups({0, 1, 2}, 2, 2), IsEmpty());
  EXPECT_THAT(CpuGroups({}, 1, 1), IsEmpty());
  EXPECT_THAT(CpuGroups({0, 1}, 0, 1), IsEmpty());
  EXPECT_THAT(CpuGroups({0, 1}, 1, 0), IsEmpty());
  EXPECT_THAT(CpuGroups({0, 1}, 1 << 30, 1 << 30), IsEmpty());  // no overflow.
}

}  // namespace
}  // namespace pipetrain::util
