// WorkerJob's metrics hooks: what it hands to metrics::WorkerMetrics after each step and when it
// stops (docs/observability.md). Each is a no-op without WorkerJobOptions::metrics.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/metrics/worker_metrics.h"
#include "server/worker/worker_job.h"

namespace pipetrain::worker {
namespace {

metrics::LinkCounters CountersOf(const link::LinkStats& s) {
  metrics::LinkCounters c;
  c.bytes_sent = s.bytes_sent;
  c.bytes_received = s.bytes_received;
  c.tensors_sent = s.tensors_sent;
  c.tensors_received = s.tensors_received;
  return c;
}

}  // namespace

void WorkerJob::RecordStepMetrics(const StepReport& report) {
  metrics::WorkerMetrics* m = options_.metrics.get();
  if (m == nullptr) return;
  for (const ActionTiming& t : report.timings) {
    m->AddBusy(schedule::OpLetter(t.action.op), absl::ToDoubleSeconds(t.compute()));
  }
  m->SetStashedBytes(report.peak_stashed_bytes);
  m->SetMailbox(mailbox_.size(), mailbox_.stored_bytes());
  absl::MutexLock lock(&links_mu_);
  RecordLinkMetrics(/*forget=*/false);
}

void WorkerJob::RecordLinkMetrics(bool forget) {
  metrics::WorkerMetrics* m = options_.metrics.get();
  if (m == nullptr) return;
  const auto record = [&](const link::PeerLink* l, const std::string& peer) {
    m->UpdateLink(l, peer, CountersOf(l->stats()));
    if (forget) m->ForgetLink(l);
  };
  for (const auto& [rank, slot] : peers_) {
    if (slot.link != nullptr) record(slot.link.get(), PeerName(rank));
  }
  for (const auto& l : coordinator_links_) record(l.get(), link::kCoordinatorPeer);
}

}  // namespace pipetrain::worker
