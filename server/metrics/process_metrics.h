// ProcessMetrics: the standard Prometheus process metrics of the daemon they run in —
// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds and process_start_time_seconds, named and computed as the
// official Prometheus clients do — read from /proc when collected (at scrape time), so nothing is
// kept or updated between scrapes (docs/observability.md).
#ifndef PIPETRAIN_SERVER_METRICS_PROCESS_METRICS_H_
#define PIPETRAIN_SERVER_METRICS_PROCESS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::metrics {

// Where the figures come from. The defaults describe the calling process; tests point them at a
// directory of fake files.
struct ProcSource {
  std::string self_dir = "/proc/self";   // holds stat, fd/ and limits.
  std::string stat_file = "/proc/stat";  // the system's boot time (btime).
  int64_t ticks_per_second = 0;          // clock ticks of the stat times; 0: sysconf(_SC_CLK_TCK).
  int64_t page_size = 0;                 // bytes per page of rss; 0: sysconf(_SC_PAGESIZE).
};

// One reading of the process figures.
struct ProcessSample {
  double cpu_seconds = 0;         // user + system CPU time.
  double resident_bytes = 0;      // resident set size.
  double virtual_bytes = 0;       // virtual memory size.
  double open_fds = 0;            // entries of fd/ (the reader's own directory handle included).
  std::optional<double> max_fds;  // the soft "Max open files" limit; unset if unlimited/unknown.
  double start_time_seconds = 0;  // process start, seconds since the Unix epoch.
};

// The fields of a /proc/PID/stat line this component reads. Times in clock ticks.
struct ProcStat {
  int64_t utime_ticks = 0;
  int64_t stime_ticks = 0;
  int64_t start_ticks = 0;  // since boot.
  int64_t vsize_bytes = 0;
  int64_t rss_pages = 0;
};

// Parses the text of /proc/PID/stat (the command name in parentheses may hold spaces and ')').
// INVALID_ARGUMENT saying which field is missing or not a number. Pure.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text);

// The boot time (the "btime" line, seconds since the epoch) in the text of /proc/stat.
// INVALID_ARGUMENT if there is no such line or it is not a number. Pure.
absl::StatusOr<int64_t> ParseBootTime(absl::string_view text);

// The soft limit of "Max open files" in the text of /proc/PID/limits; nothing if the line is
// missing or the limit is "unlimited". Pure.
std::optional<int64_t> ParseMaxOpenFiles(absl::string_view limits);

// Reads the figures from `source`. Errors: NOT_FOUND/UNAVAILABLE naming a file that cannot be
// read, INVALID_ARGUMENT naming a file that does not parse. A missing limits file only leaves
// max_fds unset. Thread-safe.
absl::StatusOr<ProcessSample> ReadProcessSample(const ProcSource& source = {});

// The Prometheus families of `sample`: the six process_* metrics above (process_max_fds only if
// known). Pure.
std::vector<prometheus::MetricFamily> ProcessFamilies(const ProcessSample& sample);

// A prometheus::Collectable that reads the process figures on each Collect() (so a scrape sees
// them as they are now). When /proc cannot be read (not Linux, or a hardened sandbox) it
// collects no families rather than failing the scrape. Thread-safe.
class ProcessCollector : public prometheus::Collectable {
 public:
  explicit ProcessCollector(ProcSource source = {}) : source_(std::move(source)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const ProcSource source_;
};

}  // namespace pipetrain::metrics

#endif  // PIPETRAIN_SERVER_METRICS_PROCESS_METRICS_H_
