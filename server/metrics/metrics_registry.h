// MetricsRegistry: the Prometheus metrics of one daemon (docs/observability.md), kept apart from
// the HTTP endpoint (MetricsServer) so that the services and their tests record and read metrics
// without a network.
//
// Every registry carries pipetrain_build_info{daemon, version, commit} = 1 and the standard
// process metrics (process_cpu_seconds_total, process_resident_memory_bytes, ...:
// process_metrics.h), read from /proc at each collection. Thread-safe: prometheus-cpp's families
// and metrics may be used from any thread.
#ifndef PIPETRAIN_SERVER_METRICS_METRICS_REGISTRY_H_
#define PIPETRAIN_SERVER_METRICS_METRICS_REGISTRY_H_

#include <prometheus/collectable.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace pipetrain::metrics {

// The version the daemons report in pipetrain_build_info: the CMake project version, as
// `--version` prints it (util::ProjectVersion).
std::string BuildVersion();

// The commit label of pipetrain_build_info: util::GitCommit(), or "unknown" when not known.
std::string BuildCommit();

class MetricsRegistry {
 public:
  // A registry for the daemon named `daemon` ("coordinator", "stage_worker").
  explicit MetricsRegistry(const std::string& daemon);
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The prometheus-cpp registry to add families to; lives as long as this object.
  prometheus::Registry& registry() { return *registry_; }
  // Everything /metrics serves — the registry's families, then the process metrics — as one
  // collectable for a MetricsServer; lives as long as its longest holder.
  std::shared_ptr<prometheus::Collectable> collectable() const { return collectable_; }

  // Every metric now in the Prometheus text exposition format (what /metrics serves).
  std::string TextExposition() const;

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::shared_ptr<prometheus::Collectable> collectable_;
};

// The value of the sample `name{labels}` (labels exactly, in any order) in a text exposition, or
// nothing if it has no such sample. For tests and tools; `labels` values must not contain quotes.
std::optional<double> SampleValue(const std::string& exposition, const std::string& name,
                                  const std::map<std::string, std::string>& labels = {});

}  // namespace pipetrain::metrics

#endif  // PIPETRAIN_SERVER_METRICS_METRICS_REGISTRY_H_
