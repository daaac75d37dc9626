// Daemon logging on spdlog (docs/observability.md): one line per event with a UTC time, a level and
// its source ("coordinator", "stage_worker[w0]"), as text or as one JSON object per line
// (--log-format json) for log collectors:
//   2026-11-23T12:40:00.123Z I coordinator job job-5f3a-1 created: 2 stages, 1f1b
//   {"time":"2026-11-23T12:40:00.123Z","level":"info","source":"coordinator","msg":"job ..."}
// Levels: INFO for job and step life, WARNING for recoveries and lost peers, ERROR for failures.
#ifndef PIPETRAIN_SERVER_LOGGING_DAEMON_LOG_H_
#define PIPETRAIN_SERVER_LOGGING_DAEMON_LOG_H_

#include <spdlog/logger.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/logging/log_level.h"

namespace pipetrain::logging {

enum class LogFormat { kText, kJson };

// "text" or "json"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text);
// "debug", "info", "warning", "error"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);

// How every logger made by Logger() writes: `format`, lines below `level` dropped, to `sink`
// (null: stderr). Loggers made before keep their settings. Thread-safe; call it in main().
void ConfigureLogging(LogFormat format, LogLevel level, spdlog::sink_ptr sink = nullptr);

// ConfigureLogging from the flag values `format` (--log-format) and `level` (--log-level), to
// stderr; INVALID_ARGUMENT naming the bad flag (and nothing changed) otherwise.
absl::Status ConfigureLoggingFromFlags(absl::string_view format, absl::string_view level);

// The logger of `source`, made on first use with the settings of ConfigureLogging (default:
// text, info, stderr). Thread-safe; the logger is thread-safe.
std::shared_ptr<spdlog::logger> Logger(const std::string& source);

// Writes `message` at `level` to the logger of `source`. Thread-safe.
void Log(const std::string& source, LogLevel level, absl::string_view message);

}  // namespace pipetrain::logging

#endif  // PIPETRAIN_SERVER_LOGGING_DAEMON_LOG_H_
