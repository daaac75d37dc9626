// LinkProber: a stage worker's side of the coordinator's link probes (docs/scaling.md, "The cost
// model"). A ProbeLinks command names other workers; the prober measures the link to each in turn
// with the link probe (link::MeasurePeerLink, the worker's own Exchange data path) on a thread of
// its own, so that the command thread (and an Assign behind the probe) does not wait, and hands
// one LinksProbed event with a MeasuredLink per target to `emit`.
#ifndef PIPETRAIN_SERVER_WORKER_LINK_PROBER_H_
#define PIPETRAIN_SERVER_WORKER_LINK_PROBER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/link_probe.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace pipetrain::worker {

// Targets one ProbeLinks may name (the proto's limit).
inline constexpr int kMaxProbeTargets = 64;

// The probe a worker runs per target: lighter than the planner's loopback probe (32 round trips,
// 2 runs of 4 tensors of 4 MiB: 32 MiB per target, ~0.3 s at 1 Gbit/s), 5 s at most, over
// `link` (the worker's link options).
link::LinkProbeOptions WorkerProbeOptions(const link::LinkOptions& link);

class LinkProber {
 public:
  using EmitFn = std::function<void(v1::WorkerEvent event)>;

  // `name`: this worker's registered name (MeasuredLink.from, the probe stream's peer name).
  // `credentials`: of the channels it dials (null: insecure). `emit` is called on the prober's
  // thread (or, for a refused command, on Start's caller) and must be thread-safe.
  LinkProber(std::string name, std::shared_ptr<grpc::ChannelCredentials> credentials,
             link::LinkProbeOptions options, EmitFn emit);
  ~LinkProber();  // Stop().
  LinkProber(const LinkProber&) = delete;
  LinkProber& operator=(const LinkProber&) = delete;

  // Starts measuring the links to `command`'s targets and returns. While a probe runs, or for a
  // command of more than kMaxProbeTargets targets, emits at once a LinksProbed whose every link
  // carries the error instead; a target without a name or address gets an error of its own.
  // After Stop, does nothing. Thread-safe.
  void Start(const v1::ProbeLinks& command);

  // Stops after the target being measured (its probe is bounded by the options' timeout), joins
  // the thread; nothing is emitted after it returns. Idempotent; thread-safe.
  void Stop();

 private:
  // The prober's thread: measures every target, then emits (unless stopping).
  void Run(v1::ProbeLinks command);
  v1::MeasuredLink Measure(const v1::LinkProbeTarget& target) const;

  // Constant after construction.
  const std::string name_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const link::LinkProbeOptions options_;
  const EmitFn emit_;

  absl::Mutex mu_;  // protects the state below.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_LINK_PROBER_H_
