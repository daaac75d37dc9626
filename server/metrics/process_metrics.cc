#include "server/metrics/process_metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain::metrics {
namespace {

// /proc files are small (a few KiB); anything longer is cut here.
constexpr size_t kMaxProcFileBytes = 1 << 16;

// The whole text of `path`. NOT_FOUND if it does not exist, UNAVAILABLE for other read errors;
// both name the file.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) {
    const int err = errno;
    const std::string what = absl::StrCat("cannot read ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(what) : absl::UnavailableError(what);
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while (text.size() < kMaxProcFileBytes && (n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    text.append(buf, n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::UnavailableError(absl::StrCat("error reading ", path));
  return text;
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text) {
  // "PID (COMM) STATE PPID ...": COMM may hold anything, so the fields start after the last ')'.
  const size_t paren = text.rfind(')');
  if (paren == absl::string_view::npos) {
    return absl::InvalidArgumentError("stat: no ')' closing the command name");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(paren + 1), ' ', absl::SkipWhitespace());
  // fields[0] is field 3 (state) of proc(5); field k is fields[k - 3].
  const auto field = [&](int k, const char* name, int64_t* out) -> absl::Status {
    const size_t i = static_cast<size_t>(k - 3);
    if (i >= fields.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stat: field ", k, " (", name, ") is missing: only ", fields.size() + 2, " fields"));
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[i]), out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stat: field ", k, " (", name, ") is not an integer: '", fields[i], "'"));
    }
    return absl::OkStatus();
  };
  ProcStat s;
  for (const absl::Status& st :
       {field(14, "utime", &s.utime_ticks), field(15, "stime", &s.stime_ticks),
        field(22, "starttime", &s.start_ticks), field(23, "vsize", &s.vsize_bytes),
        field(24, "rss", &s.rss_pages)}) {
    if (!st.ok()) return st;
  }
  return s;
}

absl::StatusOr<int64_t> ParseBootTime(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    int64_t btime = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &btime)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stat: btime is not an integer: '", line, "'"));
    }
    return btime;
  }
  return absl::InvalidArgumentError("stat: no btime line (the boot time)");
}

std::optional<int64_t> ParseMaxOpenFiles(absl::string_view limits) {
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (!absl::ConsumePrefix(&line, "Max open files")) continue;
    const std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t soft = 0;
    if (!words.empty() && absl::SimpleAtoi(words[0], &soft)) return soft;
    return std::nullopt;  // "unlimited".
  }
  return std::nullopt;
}

absl::StatusOr<ProcessSample> ReadProcessSample(const ProcSource& source) {
  const int64_t ticks =
      source.ticks_per_second > 0 ? source.ticks_per_second : sysconf(_SC_CLK_TCK);
  const int64_t page = source.page_size > 0 ? source.page_size : sysconf(_SC_PAGESIZE);
  if (ticks <= 0 || page <= 0) {
    return absl::UnavailableError("sysconf gives no clock tick rate or page size");
  }
  const std::string stat_path = source.self_dir + "/stat";
  absl::StatusOr<std::string> stat_text = ReadSmallFile(stat_path);
  if (!stat_text.ok()) return stat_text.status();
  absl::StatusOr<ProcStat> stat = ParseProcStat(*stat_text);
  if (!stat.ok())
    return absl::InvalidArgumentError(absl::StrCat(stat_path, ": ", stat.status().message()));
  absl::StatusOr<std::string> system_text = ReadSmallFile(source.stat_file);
  if (!system_text.ok()) return system_text.status();
  absl::StatusOr<int64_t> btime = ParseBootTime(*system_text);
  if (!btime.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source.stat_file, ": ", btime.status().message()));
  }

  ProcessSample s;
  s.cpu_seconds = static_cast<double>(stat->utime_ticks + stat->stime_ticks) / ticks;
  s.resident_bytes = static_cast<double>(stat->rss_pages) * page;
  s.virtual_bytes = static_cast<double>(stat->vsize_bytes);
  s.start_time_seconds =
      static_cast<double>(*btime) + static_cast<double>(stat->start_ticks) / ticks;

  const std::string fd_dir = source.self_dir + "/fd";
  std::error_code ec;
  int64_t fds = 0;
  for (std::filesystem::directory_iterator it(fd_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    ++fds;
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot list ", fd_dir, ": ", ec.message()));
  }
  s.open_fds = static_cast<double>(fds);

  if (absl::StatusOr<std::string> limits = ReadSmallFile(source.self_dir + "/limits");
      limits.ok()) {
    if (std::optional<int64_t> max = ParseMaxOpenFiles(*limits)) {
      s.max_fds = static_cast<double>(*max);
    }
  }
  return s;
}

std::vector<prometheus::MetricFamily> ProcessFamilies(const ProcessSample& sample) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families = {
      Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
             MetricType::Counter, sample.cpu_seconds),
      Family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
             sample.resident_bytes),
      Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
             sample.virtual_bytes),
      Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
             sample.open_fds),
      Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
             MetricType::Gauge, sample.start_time_seconds),
  };
  if (sample.max_fds.has_value()) {
    families.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                              MetricType::Gauge, *sample.max_fds));
  }
  return families;
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  absl::StatusOr<ProcessSample> sample = ReadProcessSample(source_);
  if (!sample.ok()) return {};
  return ProcessFamilies(*sample);
}

}  // namespace pipetrain::metrics
