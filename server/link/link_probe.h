// The link probe: a link's latency, bandwidth and CPU per message measured through the data plane
// itself (a PeerLink over StageWorker.Exchange, the frame codec and the credit window, as the
// workers send tensors), for the planner's plan::LinkCosts (docs/scaling.md, "Links").
//
// The probe sends tensors on a link whose other end answers every tensor it receives with one
// small tensor:
//   latency      the median round trip of a small tensor and its answer, halved;
//   bandwidth    the payload bytes of a run of bulk tensors (several MiB each, queued at once)
//                over the time from the first Send to the last answer, less one round trip; the
//                best of the runs (as bench/stream_bench reports: a slower run is another
//                process's load on the host, not the link);
//   message CPU  the CPU seconds of this process during the measured round trips over the tensor
//                ends they had: 4 per round trip (each of its 2 tensors is sent by one end and
//                received by the other), what plan::LinkCosts::cpu_seconds_per_message charges to
//                each op that sends or receives a tensor. With both ends in this process
//                (MeasureLoopbackLink) that is both ends' CPU; across processes
//                (MeasurePeerLink) this end's CPU over its 2 tensor ends per round trip (the
//                answering end is taken to spend as much).
#ifndef PIPETRAIN_SERVER_LINK_LINK_PROBE_H_
#define PIPETRAIN_SERVER_LINK_LINK_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/link/peer_link.h"

namespace pipetrain::link {

// The job a probe stream names (PeerHello.identity.job, generation kLinkProbeGeneration): an
// Exchange server hands such a stream to a ProbeAnswerer. No job has this id (job ids begin with
// "job-").
inline constexpr char kLinkProbeJob[] = "link-probe";
inline constexpr int64_t kLinkProbeGeneration = 1;
// Payload bytes of every answer.
inline constexpr int64_t kProbeAnswerBytes = 256;
// Probe streams a ProbeAnswerer serves at once.
inline constexpr int kMaxProbeStreams = 8;

struct LinkProbeOptions {
  // Small-tensor round trips measured (latency, CPU per message), after 8 unmeasured ones; in
  // [4, 10000]. Default 64.
  int round_trips = 64;
  // Payload bytes of a small tensor: a multiple of 4 in [4, 64 KiB].
  // Default 256.
  int64_t small_bytes = 256;
  // Payload bytes of a bulk tensor: a multiple of 4 KiB in [64 KiB, 64 MiB]. Default 4 MiB.
  int64_t bulk_bytes = int64_t{4} << 20;
  int bulk_tensors = 8;  // bulk tensors per run, in [1, 1024]. Default 8.
  int bulk_runs = 5;     // runs (after one unmeasured bulk tensor), in [1, 100]. Default 5.
  // Bounds the whole probe (a link that stalls fails it with DEADLINE_EXCEEDED); in (0, 1 h].
  // Default 10 s (a healthy loopback probe with the defaults takes well under a second).
  absl::Duration timeout = absl::Seconds(10);
  LinkOptions link;  // the options of both ends (fragment size, credit window).

  // OK, or INVALID_ARGUMENT naming the bad field and its range.
  absl::Status Check() const;
};

// What the probe measured. Every figure is positive and finite.
struct LinkMeasurement {
  double latency_seconds = 0;          // one way: the median small round trip / 2.
  double bytes_per_second = 0;         // payload bytes per second of a stream of bulk tensors.
  double cpu_seconds_per_message = 0;  // CPU seconds per tensor end (sent or received).
  int round_trips = 0;                 // small round trips measured.
  int64_t bulk_bytes = 0;              // payload bytes of the measured bulk runs.
};

// The answering end of probe streams, for an ExchangeService's accept callback: every tensor
// (activations of chunk 1, at most 64 MiB) is answered at once with kProbeAnswerBytes (a gradient
// of chunk 0 under the tensor's step). Keeps the links of the streams it serves; a stream that
// ended is let go when the next one arrives. Thread-safe.
class ProbeAnswerer {
 public:
  ProbeAnswerer();
  ~ProbeAnswerer();  // shuts every stream down.
  ProbeAnswerer(const ProbeAnswerer&) = delete;
  ProbeAnswerer& operator=(const ProbeAnswerer&) = delete;

  // Serves the probe stream `link` of `hello` (call it from the accept callback for streams of
  // kLinkProbeJob; never blocks). Errors: INVALID_ARGUMENT for a hello of another job or
  // generation; RESOURCE_EXHAUSTED when kMaxProbeStreams streams are open.
  absl::StatusOr<LinkSettings> Accept(const PeerHello& hello, std::unique_ptr<PeerLink> link);

  // Shuts every stream down; no answer is sent after this returns. Idempotent.
  void Shutdown();

 private:
  const std::shared_ptr<const math::Matrix> answer_;
  absl::Mutex mu_;  // protects links_.
  std::vector<std::unique_ptr<PeerLink>> links_ ABSL_GUARDED_BY(mu_);
};

// Measures the link to the ProbeAnswerer behind `channel` (see CreateExchangeChannel; `peer`
// names it in messages), from this process: a probe stream of kLinkProbeJob is dialled, measured
// and shut down before this returns. `hello_peer` is this end's name (PeerHello.peer). Errors as
// MeasureLoopbackLink's; a peer that refuses the stream or cannot be reached is UNAVAILABLE (or
// the peer's status code), with its message.
absl::StatusOr<LinkMeasurement> MeasurePeerLink(std::shared_ptr<grpc::Channel> channel,
                                                const std::string& peer,
                                                const std::string& hello_peer,
                                                const LinkProbeOptions& options = {});

// Measures this host's loopback link: an ExchangeService on 127.0.0.1 (an ephemeral port, plain
// text) whose streams answer every tensor, and a PeerLink dialled to it, both in
// this process and torn down before this returns. Blocks for the probe (well under a second with
// the defaults on an idle host). Errors: INVALID_ARGUMENT for bad options; UNAVAILABLE when the
// server cannot listen or the link fails (with the link's status); DEADLINE_EXCEEDED when the
// answers do not come within options.timeout. Thread-safe (each call has its own server), but
// concurrent probes measure each other's load.
absl::StatusOr<LinkMeasurement> MeasureLoopbackLink(const LinkProbeOptions& options = {});

}  // namespace pipetrain::link

#endif  // PIPETRAIN_SERVER_LINK_LINK_PROBE_H_
