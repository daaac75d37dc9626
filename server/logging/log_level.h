// LogLevel: how severe a daemon's log line is (server/logging/daemon_log.h writes them). A
// header of its own so that services can take a level-aware sink without including spdlog.
#ifndef PIPETRAIN_SERVER_LOGGING_LOG_LEVEL_H_
#define PIPETRAIN_SERVER_LOGGING_LOG_LEVEL_H_

namespace pipetrain::logging {

// kInfo: job and step life; kWarning: recoveries, lost peers; kError: failures.
enum class LogLevel { kDebug, kInfo, kWarning, kError };

}  // namespace pipetrain::logging

#endif  // PIPETRAIN_SERVER_LOGGING_LOG_LEVEL_H_
