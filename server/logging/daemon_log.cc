#include "server/logging/daemon_log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace pipetrain::logging {
namespace {

// %* in a pattern: the message as a JSON string (quoted, escaped; bad UTF-8 replaced).
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    Append(std::string(msg.payload.data(), msg.payload.size()), dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
  static void Append(const std::string& text, spdlog::memory_buf_t& dest) {
    const std::string quoted =
        nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(quoted.data(), quoted.data() + quoted.size());
  }
};

// %& in a pattern: the logger's name (the source) as a JSON string.
class JsonSourceFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    JsonMessageFlag::Append(std::string(msg.logger_name.data(), msg.logger_name.size()), dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonSourceFlag>();
  }
};

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarning:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// The settings of ConfigureLogging and the loggers made so far.
struct LogConfig {
  absl::Mutex mu;
  LogFormat format ABSL_GUARDED_BY(mu) = LogFormat::kText;
  LogLevel level ABSL_GUARDED_BY(mu) = LogLevel::kInfo;
  spdlog::sink_ptr sink ABSL_GUARDED_BY(mu);
  std::map<std::string, std::shared_ptr<spdlog::logger>> loggers ABSL_GUARDED_BY(mu);
};

LogConfig& Config() {
  static LogConfig* config = new LogConfig;  // never destroyed: loggers outlive static dtors.
  return *config;
}

std::unique_ptr<spdlog::formatter> MakeFormatter(LogFormat format) {
  auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  if (format == LogFormat::kJson) {
    f->add_flag<JsonMessageFlag>('*').add_flag<JsonSourceFlag>('&');
    f->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","source":%&,"msg":%*})");
  } else {
    f->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %L %n %v");
  }
  return f;
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-format '", text, "': expected text or json"));
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warning") return LogLevel::kWarning;
  if (text == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level '", text, "': expected debug, info, warning or error"));
}

void ConfigureLogging(LogFormat format, LogLevel level, spdlog::sink_ptr sink) {
  LogConfig& c = Config();
  absl::MutexLock lock(&c.mu);
  c.format = format;
  c.level = level;
  c.sink = std::move(sink);
  c.loggers.clear();
}

absl::Status ConfigureLoggingFromFlags(absl::string_view format, absl::string_view level) {
  absl::StatusOr<LogFormat> f = ParseLogFormat(format);
  if (!f.ok()) return f.status();
  absl::StatusOr<LogLevel> l = ParseLogLevel(level);
  if (!l.ok()) return l.status();
  ConfigureLogging(*f, *l);
  return absl::OkStatus();
}

std::shared_ptr<spdlog::logger> Logger(const std::string& source) {
  LogConfig& c = Config();
  absl::MutexLock lock(&c.mu);
  auto it = c.loggers.find(source);
  if (it != c.loggers.end()) return it->second;
  if (c.sink == nullptr) c.sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(source, c.sink);
  // Each logger formats with its own formatter (the sink's would be shared by all loggers).
  logger->set_formatter(MakeFormatter(c.format));
  logger->set_level(ToSpdlog(c.level));
  logger->flush_on(spdlog::level::debug);  // every line reaches the file at once.
  c.loggers.emplace(source, logger);
  return logger;
}

void Log(const std::string& source, LogLevel level, absl::string_view message) {
  Logger(source)->log(ToSpdlog(level), "{}", std::string_view(message.data(), message.size()));
}

}  // namespace pipetrain::logging
