#include "server/logging/daemon_log.h"

#include <spdlog/sinks/ostream_sink.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::logging {
namespace {

using ::testing::MatchesRegex;

std::vector<std::string> Lines(const std::ostringstream& out) {
  return absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
}

TEST(DaemonLogTest, TextLinesHaveTimeLevelSourceMessage) {
  std::ostringstream out;
  ConfigureLogging(LogFormat::kText, LogLevel::kInfo,
                   std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  Log("coordinator", LogLevel::kInfo, "job j1 ready");
  Log("stage_worker[w0]", LogLevel::kWarning, "link to stage/1 at 10.0.0.2:7100 failed");
  Log("coordinator", LogLevel::kDebug, "dropped: below --log-level");
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u) << out.str();
  EXPECT_THAT(lines[0], MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{3}Z I "
                                     "coordinator job j1 ready"));
  EXPECT_THAT(lines[1], MatchesRegex(".*Z W stage_worker\\[w0\\] link to stage/1 at "
                                     "10\\.0\\.0\\.2:7100 failed"));
}

TEST(DaemonLogTest, JsonLinesAreObjectsWithEscapedMessages) {
  std::ostringstream out;
  ConfigureLogging(LogFormat::kJson, LogLevel::kInfo,
                   std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  Log("coordinator", LogLevel::kError, "job \"x\" failed:\n\tbad\\path");
  Log("stage_worker[w\"1]", LogLevel::kInfo, "ok");
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u) << out.str();
  const nlohmann::json a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a["level"], "error");
  EXPECT_EQ(a["source"], "coordinator");
  EXPECT_EQ(a["msg"], "job \"x\" failed:\n\tbad\\path");
  EXPECT_THAT(a["time"].get<std::string>(), MatchesRegex("[0-9-]{10}T[0-9:]{8}\\.[0-9]{3}Z"));
  const nlohmann::json b = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(b["source"], "stage_worker[w\"1]");
  EXPECT_EQ(b["level"], "info");
}

TEST(DaemonLogTest, WarningLevelDropsInfo) {
  std::ostringstream out;
  ConfigureLogging(LogFormat::kText, LogLevel::kWarning,
                   std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  Log("coordinator", LogLevel::kInfo, "step");
  Log("coordinator", LogLevel::kWarning, "recovering");
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], MatchesRegex(".* W coordinator recovering"));
}

TEST(DaemonLogTest, ParsesFlags) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("warn").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseLogLevel("loud").status().message()),
              ::testing::HasSubstr("'loud'"));
  EXPECT_EQ(ConfigureLoggingFromFlags("json", "loud").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ConfigureLoggingFromFlags("yaml", "info").message()),
              ::testing::HasSubstr("--log-format 'yaml'"));
}

}  // namespace
}  // namespace pipetrain::logging
