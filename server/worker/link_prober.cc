#include "server/worker/link_prober.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/link/peer_link.h"

namespace pipetrain::worker {

link::LinkProbeOptions WorkerProbeOptions(const link::LinkOptions& link) {
  link::LinkProbeOptions o;
  o.round_trips = 32;
  o.bulk_tensors = 4;
  o.bulk_runs = 2;
  o.timeout = absl::Seconds(5);
  o.link = link;
  return o;
}

LinkProber::LinkProber(std::string name, std::shared_ptr<grpc::ChannelCredentials> credentials,
                       link::LinkProbeOptions options, EmitFn emit)
    : name_(std::move(name)),
      credentials_(std::move(credentials)),
      options_(std::move(options)),
      emit_(std::move(emit)) {}

LinkProber::~LinkProber() { Stop(); }

void LinkProber::Start(const v1::ProbeLinks& command) {
  std::string refusal;
  std::thread finished;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (command.targets_size() > kMaxProbeTargets) {
      refusal = absl::StrCat("ProbeLinks names ", command.targets_size(), " targets; at most ",
                             kMaxProbeTargets);
    } else if (running_) {
      refusal = "a probe of this worker's links is running already";
    } else {
      finished = std::move(thread_);  // the last probe's thread, done (running_ is false).
      running_ = true;
      thread_ = std::thread([this, command] { Run(command); });
    }
  }
  if (finished.joinable()) finished.join();
  if (refusal.empty()) return;
  v1::WorkerEvent event;
  event.mutable_links_probed();  // set even with no target.
  for (const v1::LinkProbeTarget& target : command.targets()) {
    v1::MeasuredLink* l = event.mutable_links_probed()->add_links();
    l->set_from(name_);
    l->set_to(target.name());
    l->set_error(refusal);
  }
  emit_(std::move(event));
}

void LinkProber::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

v1::MeasuredLink LinkProber::Measure(const v1::LinkProbeTarget& target) const {
  v1::MeasuredLink l;
  l.set_from(name_);
  l.set_to(target.name());
  if (target.name().empty() || target.address().empty()) {
    l.set_error(absl::StrCat("the target '", target.name(), "' at '", target.address(),
                             "' lacks a name or an address"));
    return l;
  }
  absl::StatusOr<link::LinkMeasurement> m =
      link::MeasurePeerLink(link::CreateExchangeChannel(target.address(), credentials_),
                            absl::StrCat("worker '", target.name(), "' at ", target.address()),
                            absl::StrCat("link-probe/", name_), options_);
  if (!m.ok()) {
    l.set_error(m.status().ToString());
    return l;
  }
  l.set_latency_seconds(m->latency_seconds);
  l.set_bytes_per_second(m->bytes_per_second);
  l.set_cpu_seconds_per_message(m->cpu_seconds_per_message);
  return l;
}

void LinkProber::Run(v1::ProbeLinks command) {
  v1::WorkerEvent event;
  event.mutable_links_probed();  // set even with no target.
  for (const v1::LinkProbeTarget& target : command.targets()) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    *event.mutable_links_probed()->add_links() = Measure(target);
  }
  absl::MutexLock lock(&mu_);
  running_ = false;
  if (!stopping_) emit_(std::move(event));
}

}  // namespace pipetrain::worker
