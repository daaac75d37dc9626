#include "server/metrics/worker_metrics.h"

#include <string>

namespace pipetrain::metrics {
namespace {

prometheus::Family<prometheus::Counter>& Counter(MetricsRegistry& r, const std::string& name,
                                                 const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r.registry());
}

prometheus::Family<prometheus::Gauge>& Gauge(MetricsRegistry& r, const std::string& name,
                                             const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r.registry());
}

}  // namespace

WorkerMetrics::WorkerMetrics(MetricsRegistry& r)
    : busy_(Counter(r, "pipetrain_worker_busy_seconds_total",
                    "Compute time of the worker's actions, by kind (F forward, B backward, "
                    "I input gradient, W weight gradient)")),
      sent_bytes_(Counter(r, "pipetrain_link_sent_bytes_total",
                          "Tensor payload bytes sent on the data links, by peer")),
      received_bytes_(Counter(r, "pipetrain_link_received_bytes_total",
                              "Tensor payload bytes received on the data links, by peer")),
      sent_tensors_(Counter(r, "pipetrain_link_sent_tensors_total",
                            "Tensors (activations, gradients) sent on the data links, by peer")),
      received_tensors_(Counter(r, "pipetrain_link_received_tensors_total",
                                "Tensors received on the data links, by peer")),
      mailbox_tensors_(Gauge(r, "pipetrain_worker_mailbox_tensors",
                             "Tensors received and not yet taken by the compute thread")
                           .Add({})),
      mailbox_bytes_(
          Gauge(r, "pipetrain_worker_mailbox_bytes", "Bytes of the tensors waiting in the mailbox")
              .Add({})),
      stashed_bytes_(Gauge(r, "pipetrain_worker_stashed_activation_bytes",
                           "Most bytes of stashed activations held at once in the last step")
                         .Add({})) {
  for (const char* kind : {"F", "B", "I", "W"}) busy_.Add({{"kind", kind}});
}

void WorkerMetrics::AddBusy(absl::string_view kind, double seconds) {
  if (seconds > 0) busy_.Add({{"kind", std::string(kind)}}).Increment(seconds);
}

void WorkerMetrics::UpdateLink(const void* link, const std::string& peer, const LinkCounters& now) {
  LinkCounters before;
  {
    absl::MutexLock lock(&mu_);
    LinkCounters& last = last_[link];
    before = last;
    last = now;
  }
  const prometheus::Labels labels = {{"peer", peer}};
  const auto add = [&](prometheus::Family<prometheus::Counter>& f, int64_t delta) {
    prometheus::Counter& c = f.Add(labels);
    if (delta > 0) c.Increment(static_cast<double>(delta));
  };
  add(sent_bytes_, now.bytes_sent - before.bytes_sent);
  add(received_bytes_, now.bytes_received - before.bytes_received);
  add(sent_tensors_, now.tensors_sent - before.tensors_sent);
  add(received_tensors_, now.tensors_received - before.tensors_received);
}

void WorkerMetrics::ForgetLink(const void* link) {
  absl::MutexLock lock(&mu_);
  last_.erase(link);
}

void WorkerMetrics::SetMailbox(int64_t tensors, int64_t bytes) {
  mailbox_tensors_.Set(static_cast<double>(tensors));
  mailbox_bytes_.Set(static_cast<double>(bytes));
}

void WorkerMetrics::SetStashedBytes(int64_t bytes) {
  stashed_bytes_.Set(static_cast<double>(bytes));
}

}  // namespace pipetrain::metrics
