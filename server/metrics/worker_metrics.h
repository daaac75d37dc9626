// WorkerMetrics: what a stage_worker exports to Prometheus (docs/observability.md) — compute
// seconds per action kind, bytes and tensors sent and received per data link, mailbox depth and the
// memory of stashed activations. The worker's job calls the hooks after each step; the values live
// in a MetricsRegistry, so tests read them without HTTP.
//
// Label values are bounded: kind is F, B, I or W; peer is "coordinator" or "stage/R" for the
// neighbour holding rank R (so at most the cluster's size). Thread-safe.
#ifndef PIPETRAIN_SERVER_METRICS_WORKER_METRICS_H_
#define PIPETRAIN_SERVER_METRICS_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics_registry.h"

namespace pipetrain::metrics {

// Cumulative counters of one data link (a link::LinkStats snapshot).
struct LinkCounters {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t tensors_sent = 0;
  int64_t tensors_received = 0;
};

class WorkerMetrics {
 public:
  // Registers the worker's families in `registry`, which must outlive this object.
  explicit WorkerMetrics(MetricsRegistry& registry);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Adds `seconds` of compute to action kind `kind` ("F", "B", "I", "W").
  void AddBusy(absl::string_view kind, double seconds);
  // Link `link` (any stable identity of one link object) to `peer` now has the cumulative
  // counters `now`: adds their growth since the last call for `link` to peer's counters.
  void UpdateLink(const void* link, const std::string& peer, const LinkCounters& now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `link` (call after its last UpdateLink, before the object is destroyed).
  void ForgetLink(const void* link) ABSL_LOCKS_EXCLUDED(mu_);
  // Tensors and bytes waiting in the mailbox right now.
  void SetMailbox(int64_t tensors, int64_t bytes);
  // Most bytes of activations (and their caches) held between F and W in the last step.
  void SetStashedBytes(int64_t bytes);

 private:
  prometheus::Family<prometheus::Counter>& busy_;
  prometheus::Family<prometheus::Counter>& sent_bytes_;
  prometheus::Family<prometheus::Counter>& received_bytes_;
  prometheus::Family<prometheus::Counter>& sent_tensors_;
  prometheus::Family<prometheus::Counter>& received_tensors_;
  prometheus::Gauge& mailbox_tensors_;
  prometheus::Gauge& mailbox_bytes_;
  prometheus::Gauge& stashed_bytes_;

  // Protects the last counters seen per link.
  absl::Mutex mu_;
  std::map<const void*, LinkCounters> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::metrics

#endif  // PIPETRAIN_SERVER_METRICS_WORKER_METRICS_H_
