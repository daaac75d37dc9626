#include "server/metrics/metrics_server.h"

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(MetricsServerTest, PortZeroPicksOne) {
  MetricsRegistry r("coordinator");
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", r);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT((*s)->address(), StartsWith("127.0.0.1:"));
  EXPECT_NE((*s)->address(), "127.0.0.1:0");
}

TEST(MetricsServerTest, ServesOnlyWhenRequested) {
  MetricsRegistry r("stage_worker");
  absl::StatusOr<std::unique_ptr<MetricsServer>> none = MetricsServer::ServeIfRequested("", r, "t");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  absl::StatusOr<std::unique_ptr<MetricsServer>> one =
      MetricsServer::ServeIfRequested("127.0.0.1:0", r, "t");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NE(*one, nullptr);
}

TEST(MetricsServerTest, BadAddressIsInvalidArgument) {
  MetricsRegistry r("coordinator");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":9100", "host:port"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(bad, r);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr(bad));
  }
}

TEST(MetricsServerTest, PortInUseIsUnavailable) {
  MetricsRegistry r("coordinator");
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = MetricsServer::Start("127.0.0.1:0", r);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start((*first)->address(), r);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

}  // namespace
}  // namespace pipetrain::metrics
