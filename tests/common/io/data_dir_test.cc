#include "common/io/data_dir.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::io {
namespace {

TEST(ResolveDataDirTest, EnvironmentWins) {
  EXPECT_EQ(ResolveDataDir("/srv/data", "/usr/bin"), "/srv/data");
}

TEST(ResolveDataDirTest, UnsetOrEmptyEnvironmentMeansBesideTheBinary) {
  EXPECT_EQ(ResolveDataDir(nullptr, "/opt/pt/bin"), "/opt/pt/bin/../share/pipetrain/data");
  EXPECT_EQ(ResolveDataDir("", "/usr/bin"), "/usr/bin/../share/pipetrain/data");
}

TEST(ResolveDataDirTest, UnknownBinaryDirectoryIsRelative) {
  EXPECT_EQ(ResolveDataDir(nullptr, ""), "../share/pipetrain/data");
}

TEST(ExecutableDirectoryTest, IsTheDirectoryOfThisTestBinary) {
  const std::string dir = ExecutableDirectory();
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(dir.front(), '/');
  EXPECT_NE(dir.back(), '/');
  EXPECT_THAT(dir, testing::EndsWith("/tests/common/io"));
}

}  // namespace
}  // namespace pipetrain::io
